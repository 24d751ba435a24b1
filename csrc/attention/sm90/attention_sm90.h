// attention_sm90.h: the host entries of the wgmma attention forward and backward (csrc/attention/sm90/*.cu,
// sm_90a only).
// Same arguments and meaning as attention_fwd (../attention.h); the extension compiles and binds these
// only when it is built for compute capability 9.0 (tiled_attn/cuda/_build.py, TILED_ATTN_WITH_SM90).
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "../attention.h"

namespace tiled_attn {

// Returns cudaErrorInvalidValue for a head dim this kernel does not instantiate
// (attention_sm90_head_dim_supported) or a dtype other than fp16/bf16, cudaErrorMisalignedAddress for
// operands the 16-byte copies cannot take, else the launch's error.
cudaError_t attention_fwd_sm90(AttnDtype dtype, const void* q, const void* k, const void* v, void* out, float* lse,
                               int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k,
                               int64_t head_dim, AttnStrides q_stride, AttnStrides k_stride, AttnStrides v_stride,
                               AttnStrides o_stride, float scale, bool causal, int64_t causal_offset,
                               cudaStream_t stream);

// The warp-specialized kernel (sm90/flash_fwd_sm90_ws_kernel.cuh: a TMA producer warp, two consumer
// warpgroups): same arguments, results and errors; cudaErrorInvalidValue also when the driver refuses
// a tensor map.
cudaError_t attention_fwd_sm90_ws(AttnDtype dtype, const void* q, const void* k, const void* v, void* out, float* lse,
                                  int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seqlen_q,
                                  int64_t seqlen_k, int64_t head_dim, AttnStrides q_stride, AttnStrides k_stride,
                                  AttnStrides v_stride, AttnStrides o_stride, float scale, bool causal,
                                  int64_t causal_offset, cudaStream_t stream);

// The head dims the kernel instantiates: 64, 128, 256; warp_specialized also 96 and 192.
bool attention_sm90_head_dim_supported(int64_t head_dim, bool warp_specialized);

// The attention backward on wgmma (flash_bwd_sm90_kernel.cuh) for head dims 64 and 128, fp16/bf16: q, k,
// v, dout as for the forward (dout laid out like q); lse the forward's, delta = rowsum(dout · out) (minus
// lse's gradient), both (B, Hq, Nq) float32 contiguous. Adds Σ_j dS_ij k_j (without the softmax scale) to
// dq_accum, a zeroed (B·Hq, Nq, D) float32 contiguous buffer, with float32 atomics (run-to-run order
// varies); overwrites dk (scaled) and dv, summed over each GQA group. cudaErrorInvalidValue for an
// empty sequence, another head dim or dtype, or a block_m the head dim has no tile for;
// cudaErrorMisalignedAddress where a base or stride breaks TMA's 16-byte rule. block_m: query rows per
// step, 64 (0: the default) or 128 (D = 64 only). kv_split (>= 1, dividing Hq / Hkv): each GQA group's query
// heads split among that many CTAs per key tile (a small grid's critical path cut: the planner's choice); above
// 1 dk and dv must be float32 (dkv_f32) of shape (B, Hkv·kv_split, Nk, D), partial j of kv head h at head
// h·kv_split + j, for the caller to sum. longest_first: CTAs in key-tile-major order (BwdParams says why).
cudaError_t attention_bwd_sm90(AttnDtype dtype, const void* q, const void* k, const void* v, const void* dout,
                               const float* lse, const float* delta, float* dq_accum, void* dk, void* dv,
                               int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k,
                               int64_t head_dim, AttnStrides q_stride, AttnStrides k_stride, AttnStrides v_stride,
                               AttnStrides do_stride, AttnStrides dk_stride, AttnStrides dv_stride, float scale,
                               bool causal, int64_t causal_offset, int64_t block_m, bool dkv_f32,
                               int64_t kv_split, bool longest_first, cudaStream_t stream);

bool attention_bwd_sm90_head_dim_supported(int64_t head_dim);

}  // namespace tiled_attn
