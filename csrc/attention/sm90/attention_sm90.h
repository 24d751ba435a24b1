// attention_sm90.h: the host entry of the wgmma attention forward (csrc/attention/sm90/*.cu, sm_90a only).
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

bool attention_sm90_head_dim_supported(int64_t head_dim);

}  // namespace tiled_attn
