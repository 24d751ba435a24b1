// flash_fwd_sm90.cu: attention_fwd_sm90 and attention_fwd_sm90_ws (attention_sm90.h): the argument checks and Params shared with the
// mma.sync kernel (flash_fwd::make_params), and the dispatch over head dim and dtype (Sm90HeadDims) to
// the instantiations in flash_fwd_sm90_hdim*.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "../flash_fwd.cuh"
#include "attention_sm90.h"

namespace tiled_attn {
namespace flash_fwd_sm90 {
template <int kHeadDim, typename T>
cudaError_t run_flash_fwd_sm90(const flash_fwd::Params& params, int batch_heads, cudaStream_t stream);
template <int kHeadDim, typename T>
cudaError_t run_flash_fwd_sm90_ws(const flash_fwd::Params& params, int batch_heads, cudaStream_t stream);
}  // namespace flash_fwd_sm90

// What flash_fwd_sm90_hdim<D>.cu instantiate (tiled_attn/cuda/attention.py SM90_HEAD_DIMS and
// SM90_WS_HEAD_DIMS mirror them): the cp.async kernel whole 64-column blocks only, the warp-specialized
// one also D = 96 (padded to 128 columns in shared memory by TMA's zero fill) and 192.
using Sm90HeadDims = flash_fwd::HeadDims<64, 128, 256>;
using Sm90WsHeadDims = flash_fwd::HeadDims<64, 96, 128, 192, 256>;

bool attention_sm90_head_dim_supported(int64_t head_dim, bool warp_specialized) {
  return warp_specialized ? Sm90WsHeadDims::contains(head_dim) : Sm90HeadDims::contains(head_dim);
}

namespace {
// Both entries' path: the checks and Params of make_params, then the cp.async kernel or (kWs) the
// warp-specialized one for the dtype and head dim.
template <bool kWs, typename... Args>
cudaError_t run_sm90(AttnDtype dtype, int64_t head_dim, cudaStream_t stream, const Args&... args) {
  using Dims = std::conditional_t<kWs, Sm90WsHeadDims, Sm90HeadDims>;
  return Dims::run(
      dtype, head_dim,
      [&](auto elem, auto dim, flash_fwd::Params& p, int batch_heads) {
        using T = typename decltype(elem)::type;
        constexpr int kD = decltype(dim)::value;
        if constexpr (kWs) return flash_fwd_sm90::run_flash_fwd_sm90_ws<kD, T>(p, batch_heads, stream);
        else return flash_fwd_sm90::run_flash_fwd_sm90<kD, T>(p, batch_heads, stream);
      },
      args...);
}
}  // namespace

cudaError_t attention_fwd_sm90(AttnDtype dtype, const void* q, const void* k, const void* v, void* out, float* lse,
                               int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k,
                               int64_t head_dim, AttnStrides q_stride, AttnStrides k_stride, AttnStrides v_stride,
                               AttnStrides o_stride, float scale, bool causal, int64_t causal_offset,
                               cudaStream_t stream) {
  return run_sm90<false>(dtype, head_dim, stream, q, k, v, out, lse, batch, heads_q, heads_kv, seqlen_q, seqlen_k,
                         q_stride, k_stride, v_stride, o_stride, scale, causal, causal_offset);
}

cudaError_t attention_fwd_sm90_ws(AttnDtype dtype, const void* q, const void* k, const void* v, void* out, float* lse,
                                  int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seqlen_q,
                                  int64_t seqlen_k, int64_t head_dim, AttnStrides q_stride, AttnStrides k_stride,
                                  AttnStrides v_stride, AttnStrides o_stride, float scale, bool causal,
                                  int64_t causal_offset, cudaStream_t stream) {
  return run_sm90<true>(dtype, head_dim, stream, q, k, v, out, lse, batch, heads_q, heads_kv, seqlen_q, seqlen_k,
                        q_stride, k_stride, v_stride, o_stride, scale, causal, causal_offset);
}

}  // namespace tiled_attn
