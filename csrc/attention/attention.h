// attention.h: the host-side entry of the fused attention forward (csrc/attention/*.cu).
// Plain CUDA types only (no torch): bindings.cpp converts tensors and calls this.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace tiled_attn {

enum class AttnDtype : int { kFloat16 = 0, kBFloat16 = 1 };

struct AttnStrides {  // in elements; the head dim (last) is contiguous
  int64_t batch, head, seq;
};

// out[b, h, i, :] = softmax_j(scale · q[b,h,i]·k[b,h/g,j]) v[b,h/g,j] over visible j, g = Hq / Hkv;
// with `causal`, key j is visible from query i iff j <= i + causal_offset. lse[b, h, i] is the
// natural-log sum of exp (float32, contiguous (B, Hq, Nq)); a row with no visible key gets output 0
// and lse -inf. Returns cudaErrorInvalidValue for a head dim the templates do not instantiate
// (attention_head_dim_supported says which), else the launch's error.
cudaError_t attention_fwd(AttnDtype dtype, const void* q, const void* k, const void* v, void* out, float* lse,
                          int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k,
                          int64_t head_dim, AttnStrides q_stride, AttnStrides k_stride, AttnStrides v_stride,
                          AttnStrides o_stride, float scale, bool causal, int64_t causal_offset,
                          cudaStream_t stream);

// The same result by split-KV (flash-decoding): the keys cut into num_splits ranges, each computed by
// its own CTAs with the rows of a GQA group packed into one tile (K/V read once per group), the
// partial states written to `workspace` and merged by a second kernel (csrc/attention/
// attention_merge.cuh). For short queries against long keys (decode). `workspace`: 16-byte aligned
// float32, attention_split_workspace_floats(...) of them, on the launch's stream (no other
// requirement: every element the merge reads is written first). Both kernels go on `stream`, nothing
// syncs the host (CUDA-graph capturable). Errors as attention_fwd's, and cudaErrorInvalidValue for
// num_splits outside [1, 65535] or Nq·(Hq / Hkv) + Nk >= INT_MAX − 256.
cudaError_t attention_fwd_split(AttnDtype dtype, const void* q, const void* k, const void* v, void* out, float* lse,
                                float* workspace, int64_t num_splits, int64_t batch, int64_t heads_q,
                                int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k, int64_t head_dim,
                                AttnStrides q_stride, AttnStrides k_stride, AttnStrides v_stride,
                                AttnStrides o_stride, float scale, bool causal, int64_t causal_offset,
                                cudaStream_t stream);

// B·Hq·Nq·num_splits·(D + 2): the partial accumulators, maxima and sums.
inline int64_t attention_split_workspace_floats(int64_t batch, int64_t heads_q, int64_t seqlen_q, int64_t head_dim,
                                                int64_t num_splits) {
  return batch * heads_q * seqlen_q * num_splits * (head_dim + 2);
}

bool attention_head_dim_supported(int64_t head_dim);

}  // namespace tiled_attn
