// flash_bwd_sm90.cu: attention_bwd_sm90 (attention_sm90.h): the argument checks, BwdParams, and the
// dispatch over head dim and dtype (BwdHeadDims) to the instantiations in flash_bwd_sm90_hdim*.cu.
#include <climits>

#include "../flash_fwd.cuh"
#include "attention_sm90.h"
#include "flash_bwd_sm90.cuh"

namespace tiled_attn {
namespace flash_fwd_sm90 {
template <int kHeadDim, typename T>
cudaError_t run_flash_bwd_sm90(const BwdParams& params, const BwdOperands& a, int block_m, cudaStream_t stream);
}  // namespace flash_fwd_sm90

// What flash_bwd_sm90_hdim<D>.cu instantiate (tiled_attn/cuda/attention_backward.py mirrors it).
using BwdHeadDims = flash_fwd::HeadDims<64, 128>;

bool attention_bwd_sm90_head_dim_supported(int64_t head_dim) { return BwdHeadDims::contains(head_dim); }

cudaError_t attention_bwd_sm90(AttnDtype dtype, const void* q, const void* k, const void* v, const void* dout,
                               const float* lse, const float* delta, float* dq_accum, void* dk, void* dv,
                               int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k,
                               int64_t head_dim, AttnStrides q_stride, AttnStrides k_stride, AttnStrides v_stride,
                               AttnStrides do_stride, AttnStrides dk_stride, AttnStrides dv_stride, float scale,
                               bool causal, int64_t causal_offset, int64_t block_m, bool dkv_f32,
                               int64_t kv_split, bool longest_first, cudaStream_t stream) {
  using flash_fwd::aligned16;
  using flash_fwd::strides_ok;
  if (!BwdHeadDims::contains(head_dim) || !flash_fwd::dtype_supported(dtype)) return cudaErrorInvalidValue;
  if (block_m == 0) block_m = 64;
  if (block_m != 64 && !(block_m == 128 && head_dim == 64)) return cudaErrorInvalidValue;
  // Empty sequences have no tensor map (every dimension must be >= 1): the caller handles them.
  if (batch <= 0 || heads_q <= 0 || heads_kv <= 0 || heads_q % heads_kv != 0 || seqlen_q <= 0 || seqlen_k <= 0 ||
      seqlen_q > INT_MAX - 256 || seqlen_k > INT_MAX - 256 || batch > INT_MAX / heads_q) {
    return cudaErrorInvalidValue;
  }
  // Split partials are float32, one (virtual) head each.
  if (kv_split < 1 || (heads_q / heads_kv) % kv_split != 0 || (kv_split > 1 && !dkv_f32)) return cudaErrorInvalidValue;
  const int64_t heads_dkv = heads_kv * kv_split;
  // TMA's rules (16-byte bases and strides) for the maps; the dK / dV stores and dQ reductions need
  // 8-byte alignment, which the same rules give.
  if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(dout) || !aligned16(dk) || !aligned16(dv) ||
      !aligned16(dq_accum) || !strides_ok(q_stride, batch, heads_q, seqlen_q) ||
      !strides_ok(k_stride, batch, heads_kv, seqlen_k) || !strides_ok(v_stride, batch, heads_kv, seqlen_k) ||
      !strides_ok(do_stride, batch, heads_q, seqlen_q) || !strides_ok(dk_stride, batch, heads_dkv, seqlen_k) ||
      !strides_ok(dv_stride, batch, heads_dkv, seqlen_k)) {
    return cudaErrorMisalignedAddress;
  }
  flash_fwd_sm90::BwdParams p{};
  p.lse = lse;
  p.delta = delta;
  p.dq_accum = dq_accum;
  p.dk = dk;
  p.dv = dv;
  p.dkv_f32 = dkv_f32;
  p.dk_batch = dk_stride.batch, p.dk_head = dk_stride.head, p.dk_seq = dk_stride.seq;
  p.dv_batch = dv_stride.batch, p.dv_head = dv_stride.head, p.dv_seq = dv_stride.seq;
  p.causal_offset = flash_fwd::clamp_causal_offset(causal_offset, seqlen_q, seqlen_k);
  p.heads_q = static_cast<int>(heads_q);
  p.heads_kv = static_cast<int>(heads_dkv);
  p.group = static_cast<int>(heads_q / heads_dkv);
  p.kv_split = static_cast<int>(kv_split);
  p.longest_first = longest_first;
  p.seqlen_q = static_cast<int>(seqlen_q);
  p.seqlen_k = static_cast<int>(seqlen_k);
  p.scale_log2 = scale * kLog2e;
  p.scale = scale;
  p.causal = causal;
  const flash_fwd_sm90::BwdOperands a{q, k, v, dout, batch, static_cast<int>(heads_kv), q_stride, k_stride,
                                        v_stride, do_stride};
  return BwdHeadDims::dispatch(dtype, head_dim, [&](auto elem, auto dim) {
    using T = typename decltype(elem)::type;
    return flash_fwd_sm90::run_flash_bwd_sm90<decltype(dim)::value, T>(p, a, static_cast<int>(block_m), stream);
  });
}

}  // namespace tiled_attn
