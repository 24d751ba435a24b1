// attention_merge.cu: the split-KV merge kernel's launch and its dispatch over head dim and dtype
// (the kernel and what it computes: attention_merge.cuh).
#include "attention_merge.cuh"

namespace tiled_attn {
namespace flash_fwd {

#ifndef TILED_ATTN_EMULATION
template <int kHeadDim, typename T>
cudaError_t launch_merge_kernel(const MergeParams& p, cudaStream_t stream) {
  const int64_t threads = p.rows * (kHeadDim / 4);
  const int64_t blocks = (threads + kMergeThreads - 1) / kMergeThreads;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  attention_merge_kernel<kHeadDim, T><<<static_cast<unsigned>(blocks), kMergeThreads, 0, stream>>>(p);
  return cudaGetLastError();
}
#endif

namespace {
template <typename T>
cudaError_t merge_head_dim(int64_t head_dim, const MergeParams& p, cudaStream_t stream) {
  switch (head_dim) {
    case 32: return launch_merge_kernel<32, T>(p, stream);
    case 64: return launch_merge_kernel<64, T>(p, stream);
    case 96: return launch_merge_kernel<96, T>(p, stream);
    case 128: return launch_merge_kernel<128, T>(p, stream);
    case 192: return launch_merge_kernel<192, T>(p, stream);
    case 256: return launch_merge_kernel<256, T>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}
}  // namespace

cudaError_t run_attention_merge(AttnDtype dtype, int64_t head_dim, const MergeParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  return dtype == AttnDtype::kFloat16 ? merge_head_dim<__half>(head_dim, p, stream)
                                      : merge_head_dim<__nv_bfloat16>(head_dim, p, stream);
}

}  // namespace flash_fwd
}  // namespace tiled_attn
