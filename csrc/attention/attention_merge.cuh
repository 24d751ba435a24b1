// attention_merge.cuh: the second kernel of split-KV attention (flash-decoding). flash_fwd_kernel<Tr, T,
// true> leaves, for every (batch, query head, query) row, one unnormalized partial state per key split
// in a float32 workspace (Params::partial in flash_fwd.cuh: acc [parts, D], m [parts] in log2 units,
// l [parts]; a row's num_splits partials are adjacent). This kernel folds a row's partials with the
// header's split merge (AttnRowState::merge_max / merge_add, online_softmax.cuh: the max first, then
// each partial weighted once) and finalizes like the forward's epilogue: out = acc / l in the input
// dtype, lse = m + log l in natural units; a row whose every partial is the identity (no visible key)
// gets output 0 and lse -inf. One thread per (row, 4 head-dim columns): float4 loads of each
// partial's 4 accumulators, 8-byte output stores; every thread of a row reads the row's S (m, l)
// pairs (the same addresses: broadcast in a warp, L1 hits across warps). Included by
// attention_merge.cu and the CPU emulator (which supplies launch_merge_kernel).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../online_softmax.cuh"
#include "attention.h"
#include "device_common.cuh"

namespace tiled_attn {
namespace flash_fwd {

struct MergeParams {
  const float* partial;  // the split kernel's workspace (Params::partial)
  void* out;             // (B, Hq, Nq, D) through its strides (elements), head dim contiguous
  float* lse;            // (B, Hq, Nq) contiguous
  int64_t o_batch, o_head, o_seq;
  int64_t rows;       // B·Hq·Nq
  int64_t num_parts;  // rows·num_splits
  int heads_q, seqlen_q, num_splits;
};

constexpr int kMergeThreads = 128;

template <int kHeadDim, typename T>
__global__ void __launch_bounds__(kMergeThreads) attention_merge_kernel(const MergeParams p) {
  constexpr int kChunks = kHeadDim / 4;  // 4 columns per thread
  const int64_t idx = int64_t{blockIdx.x} * kMergeThreads + threadIdx.x;
  if (idx >= p.rows * kChunks) return;
  const int64_t row = idx / kChunks;
  const int col = static_cast<int>(idx - row * kChunks) * 4;

  const int64_t part0 = row * p.num_splits;
  const float* const part_m = p.partial + p.num_parts * kHeadDim + part0;
  const float* const part_l = p.partial + p.num_parts * (kHeadDim + 1) + part0;
  const float* const part_acc = p.partial + part0 * kHeadDim + col;

  AttnRowState st = AttnRowState::identity();
  for (int s = 0; s < p.num_splits; ++s) st.merge_max(part_m[s]);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s = 0; s < p.num_splits; ++s) {
    const float w = st.merge_add(part_m[s], part_l[s]);
    const float4 a = *reinterpret_cast<const float4*>(part_acc + int64_t{s} * kHeadDim);
    acc.x = fmaf(w, a.x, acc.x);
    acc.y = fmaf(w, a.y, acc.y);
    acc.z = fmaf(w, a.z, acc.z);
    acc.w = fmaf(w, a.w, acc.w);
  }
  float lse;
  const float inv_l = st.finalize(lse);  // 0 for a row with no visible key: output 0, lse -inf

  const int64_t bh = row / p.seqlen_q, i = row - bh * p.seqlen_q;
  const int64_t b = bh / p.heads_q, h = bh - b * p.heads_q;
  T* const o = static_cast<T*>(p.out) + b * p.o_batch + h * p.o_head + i * p.o_seq + col;
  *reinterpret_cast<uint2*>(o) = make_uint2(pack2<T>(acc.x * inv_l, acc.y * inv_l),
                                            pack2<T>(acc.z * inv_l, acc.w * inv_l));
  if (col == 0) p.lse[row] = lse;
}

// The launch over every row (attention_merge.cu; the emulator supplies its own).
template <int kHeadDim, typename T>
cudaError_t launch_merge_kernel(const MergeParams& p, cudaStream_t stream);

// Dispatch over head dim and dtype (attention_merge.cu): cudaErrorInvalidValue for a head dim the
// forward does not instantiate.
cudaError_t run_attention_merge(AttnDtype dtype, int64_t head_dim, const MergeParams& p, cudaStream_t stream);

}  // namespace flash_fwd
}  // namespace tiled_attn
