// flash_fwd_sm90.cu: attention_fwd_sm90 (attention_sm90.h): the argument checks and Params shared with the
// mma.sync kernel (flash_fwd::make_params), and the dispatch over head dim and dtype to the
// instantiations in flash_fwd_sm90_hdim*.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../flash_fwd.cuh"
#include "attention_sm90.h"

namespace tiled_attn {
namespace flash_fwd_sm90 {
template <int kHeadDim, typename T>
cudaError_t run_flash_fwd_sm90(const flash_fwd::Params& params, int batch_heads, cudaStream_t stream);
}  // namespace flash_fwd_sm90

bool attention_sm90_head_dim_supported(int64_t head_dim) {
  switch (head_dim) {
    case 64: case 128: case 256: return true;
    default: return false;
  }
}

namespace {

template <typename T>
cudaError_t dispatch_head_dim_sm90(const flash_fwd::Params& p, int64_t head_dim, int batch_heads, cudaStream_t stream) {
  switch (head_dim) {
    case 64: return flash_fwd_sm90::run_flash_fwd_sm90<64, T>(p, batch_heads, stream);
    case 128: return flash_fwd_sm90::run_flash_fwd_sm90<128, T>(p, batch_heads, stream);
    case 256: return flash_fwd_sm90::run_flash_fwd_sm90<256, T>(p, batch_heads, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t attention_fwd_sm90(AttnDtype dtype, const void* q, const void* k, const void* v, void* out, float* lse,
                               int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k,
                               int64_t head_dim, AttnStrides q_stride, AttnStrides k_stride, AttnStrides v_stride,
                               AttnStrides o_stride, float scale, bool causal, int64_t causal_offset,
                               cudaStream_t stream) {
  if (!attention_sm90_head_dim_supported(head_dim)) return cudaErrorInvalidValue;
  if (dtype != AttnDtype::kFloat16 && dtype != AttnDtype::kBFloat16) return cudaErrorInvalidValue;
  flash_fwd::Params p;
  int batch_heads;
  const cudaError_t err = flash_fwd::make_params(q, k, v, out, lse, batch, heads_q, heads_kv, seqlen_q, seqlen_k,
                                                 q_stride, k_stride, v_stride, o_stride, scale, causal,
                                                 causal_offset, p, batch_heads);
  if (err != cudaSuccess || batch_heads == 0) return err;
  return dtype == AttnDtype::kFloat16 ? dispatch_head_dim_sm90<__half>(p, head_dim, batch_heads, stream)
                                      : dispatch_head_dim_sm90<__nv_bfloat16>(p, head_dim, batch_heads, stream);
}

}  // namespace tiled_attn
