// flash_fwd.cu: attention_fwd (attention.h): argument checks, Params, and the dispatch over head dim
// and dtype to the instantiations in flash_fwd_hdim*.cu. The Python wrapper
// (tiled_attn/cuda/attention.py) has already raised a ValueError for anything rejected here; these
// checks keep a direct C++ caller from launching on bad input.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>

#include "../online_softmax.cuh"
#include "attention.h"
#include "flash_fwd.cuh"

namespace tiled_attn {

bool attention_head_dim_supported(int64_t head_dim) {
  switch (head_dim) {
    case 32: case 64: case 96: case 128: case 192: case 256: return true;
    default: return false;
  }
}

namespace {

template <typename T>
cudaError_t dispatch_head_dim(const flash_fwd::Params& p, int64_t head_dim, int batch_heads, cudaStream_t stream) {
  switch (head_dim) {
    case 32: return flash_fwd::run_flash_fwd<32, T>(p, batch_heads, stream);
    case 64: return flash_fwd::run_flash_fwd<64, T>(p, batch_heads, stream);
    case 96: return flash_fwd::run_flash_fwd<96, T>(p, batch_heads, stream);
    case 128: return flash_fwd::run_flash_fwd<128, T>(p, batch_heads, stream);
    case 192: return flash_fwd::run_flash_fwd<192, T>(p, batch_heads, stream);
    case 256: return flash_fwd::run_flash_fwd<256, T>(p, batch_heads, stream);
    default: return cudaErrorInvalidValue;
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }
// 16-byte cp.async / stores need every row start 16-byte aligned: strides in multiples of 8 elements
// (the stride of a dim of size 1 is never multiplied by a nonzero index, so any value is fine there).
bool strides_ok(const AttnStrides& s, int64_t batch, int64_t heads, int64_t seqlen) {
  return (batch <= 1 || s.batch % 8 == 0) && (heads <= 1 || s.head % 8 == 0) && (seqlen <= 1 || s.seq % 8 == 0);
}

}  // namespace

cudaError_t attention_fwd(AttnDtype dtype, const void* q, const void* k, const void* v, void* out, float* lse,
                          int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k,
                          int64_t head_dim, AttnStrides q_stride, AttnStrides k_stride, AttnStrides v_stride,
                          AttnStrides o_stride, float scale, bool causal, int64_t causal_offset,
                          cudaStream_t stream) {
  if (!attention_head_dim_supported(head_dim)) return cudaErrorInvalidValue;
  if (dtype != AttnDtype::kFloat16 && dtype != AttnDtype::kBFloat16) return cudaErrorInvalidValue;
  if (batch < 0 || heads_q < 0 || heads_kv <= 0 || heads_q % heads_kv != 0) return cudaErrorInvalidValue;
  if (heads_q > 0 && batch > INT_MAX / heads_q) return cudaErrorInvalidValue;  // (batch, head) index is an int
  // Sequence positions are ints inside the kernel (every offset built from them is 64-bit).
  if (seqlen_q < 0 || seqlen_k < 0 || seqlen_q > INT_MAX - 256 || seqlen_k > INT_MAX - 256) {
    return cudaErrorInvalidValue;
  }
  if (batch == 0 || heads_q == 0 || seqlen_q == 0) return cudaSuccess;  // nothing to write
  if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(out) ||
      !strides_ok(q_stride, batch, heads_q, seqlen_q) || !strides_ok(k_stride, batch, heads_kv, seqlen_k) ||
      !strides_ok(v_stride, batch, heads_kv, seqlen_k) || !strides_ok(o_stride, batch, heads_q, seqlen_q)) {
    return cudaErrorMisalignedAddress;
  }

  flash_fwd::Params p{};
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.lse = lse;
  p.q_batch = q_stride.batch, p.q_head = q_stride.head, p.q_seq = q_stride.seq;
  p.k_batch = k_stride.batch, p.k_head = k_stride.head, p.k_seq = k_stride.seq;
  p.v_batch = v_stride.batch, p.v_head = v_stride.head, p.v_seq = v_stride.seq;
  p.o_batch = o_stride.batch, p.o_head = o_stride.head, p.o_seq = o_stride.seq;
  p.heads_q = static_cast<int>(heads_q);
  p.group = static_cast<int>(heads_q / heads_kv);
  p.bh_offset = 0;
  // Beyond [-Nq, Nk] the offset changes nothing (every row sees all keys, or none), and clamped
  // there i + offset + 1 cannot overflow in the kernel.
  p.causal_offset = causal_offset < -seqlen_q ? -seqlen_q : (causal_offset > seqlen_k ? seqlen_k : causal_offset);
  p.seqlen_q = static_cast<int>(seqlen_q);
  p.seqlen_k = static_cast<int>(seqlen_k);
  p.scale_log2 = scale * kLog2e;
  p.causal = causal;

  const int batch_heads = static_cast<int>(batch * heads_q);
  return dtype == AttnDtype::kFloat16 ? dispatch_head_dim<__half>(p, head_dim, batch_heads, stream)
                                      : dispatch_head_dim<__nv_bfloat16>(p, head_dim, batch_heads, stream);
}

}  // namespace tiled_attn
