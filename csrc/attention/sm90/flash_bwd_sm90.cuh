// flash_bwd_sm90.cuh: what the wgmma attention backward's entry (flash_bwd_sm90.cu), its per-head-dim
// instantiations (flash_bwd_sm90_hdim*.cu) and the kernel (flash_bwd_sm90_kernel.cuh) share: the
// kernel's parameters and the host-side operands its tensor maps are made from. No kernel code here.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../attention.h"

namespace tiled_attn {
namespace flash_fwd_sm90 {

// Everything the consumers read besides the tiles (which arrive by TMA through BwdMaps).
struct BwdParams {
  const float* lse;    // (B, Hq, Nq) contiguous, natural log; -inf for a row with no visible key
  const float* delta;  // (B, Hq, Nq) contiguous: rowsum(dO · O), minus lse's gradient if any
  float* dq_accum;     // (B·Hq, Nq, D) contiguous float32: += Σ_j dS_ij k_j, without the softmax scale
  void* dk;            // (B, Hkv, Nk, D), overwritten: scale · Σ dS_ij q_i over the GQA group
  void* dv;            // (B, Hkv, Nk, D), overwritten: Σ P_ij dO_i over the GQA group
  bool dkv_f32;        // dk and dv are float32 (else q's dtype): partial sums a caller adds up unrounded
  // kv_split > 1: each kv head's group of query heads is split among kv_split CTAs per key tile, and
  // heads_kv / group below are the "virtual" heads (Hkv·kv_split of group / kv_split query heads each):
  // virtual head hv reads K and V of head hv / kv_split and writes its float32 partial dK / dV at head hv
  // of dk / dv (B, Hkv·kv_split, Nk, D), which the caller sums over the kv_split partials of a kv head.
  int kv_split;
  // The CTAs in key-tile-major order (BwdTile): the planner's choice for a causal grid of few waves,
  // where the launch order (x fastest) would start some slots' longest walks last.
  bool longest_first;
  int64_t dk_batch, dk_head, dk_seq;
  int64_t dv_batch, dv_head, dv_seq;
  int64_t causal_offset;  // key j visible from query i iff j <= i + causal_offset (clamped to [-Nq, Nk])
  int heads_q, heads_kv, group;  // heads_kv, group: virtual (kv_split)
  int bh_offset;  // first (batch·Hkv + kv head) slot of this launch (grid.y is capped at 65535)
  int seqlen_q, seqlen_k;
  float scale_log2;  // softmax scale · log2 e
  float scale;
  bool causal;
};

// The tile maps, one __grid_constant__ parameter: Q, K, V, dO over (D, N, H, B), innermost first
// (16-bit loads), and dQ's float32 accumulator over (D, Nq, Hq, B) (reduce-adds of 32-column boxes).
struct BwdMaps {
  CUtensorMap q, k, v, dout, dq;
};

// The 16-bit operands the maps are made from: bases and element strides (head dim contiguous).
struct BwdOperands {
  const void* q;
  const void* k;
  const void* v;
  const void* dout;
  int64_t batch;
  int heads_kv;  // K's and V's heads (BwdParams::heads_kv counts the virtual ones)
  AttnStrides q_stride, k_stride, v_stride, do_stride;
};

}  // namespace flash_fwd_sm90
}  // namespace tiled_attn
