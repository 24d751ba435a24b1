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

bool attention_head_dim_supported(int64_t head_dim);

}  // namespace tiled_attn
