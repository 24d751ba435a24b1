// online_softmax.cuh: the online-softmax state in CUDA, the one place the recurrence of DESIGN §1
// is written. Every kernel in csrc/ (the softmax ladder and the attention tile kernel) calls these
// verbs; none re-derives the math inline.
//
//   update by x:     m' = max(m, x),          l' = l·exp(m − m') + exp(x − m')
//   merge two:       m  = max(m1, m2),        l  = l1·exp(m1 − m) + l2·exp(m2 − m)
//   finalize:        y  = exp(x − m) / l,     lse = m + log(l)
//
// Numerics: exp(a − b) is computed as exp2f((a − b)·log2 e): the subtraction comes first, so logits
// of ±1e4 lose nothing to the product's rounding. A max of -inf (only -inf seen) is shifted by 0
// instead, so exp(-inf − 0) = 0 and the identity state (m = -inf, l = 0) merges without NaN.
// Includes only CUDA headers (no torch): see DESIGN §2.
#pragma once

#include <cuda_runtime.h>
#include <math_constants.h>

namespace tiled_attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kWarpSize = 32;

// The shift to subtract: m itself, or 0 when m is -inf.
__device__ __forceinline__ float finite_or_zero(float m) { return m == -CUDART_INF_F ? 0.f : m; }

// exp(x − shift) for a shift that finite_or_zero already made safe. exp2f lowers to ex2.approx:
// ~2 ulp, well inside the numerics rule, and one SFU op.
__device__ __forceinline__ float exp_shifted(float x, float shift) { return exp2f((x - shift) * kLog2e); }

struct OnlineState {
  float m;  // running max
  float l;  // running sum of exp(x − m)

  static __device__ __forceinline__ OnlineState identity() { return {-CUDART_INF_F, 0.f}; }

  // Fold one element.
  __device__ __forceinline__ void update(float x) {
    const float m_new = fmaxf(m, x);
    const float shift = finite_or_zero(m_new);
    l = l * exp_shifted(m, shift) + exp_shifted(x, shift);
    m = m_new;
  }

  // Fold a tile held in registers: one max, one rescale, N exponentials (cheaper than N updates).
  template <int N>
  __device__ __forceinline__ void update(const float (&x)[N]) {
    float tile_max = x[0];
#pragma unroll
    for (int i = 1; i < N; ++i) tile_max = fmaxf(tile_max, x[i]);
    const float m_new = fmaxf(m, tile_max);
    const float shift = finite_or_zero(m_new);
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < N; ++i) sum += exp_shifted(x[i], shift);
    l = l * exp_shifted(m, shift) + sum;
    m = m_new;
  }

  // Fold another state (disjoint part of the same row).
  __device__ __forceinline__ void merge(const OnlineState& o) {
    const float m_new = fmaxf(m, o.m);
    const float shift = finite_or_zero(m_new);
    l = l * exp_shifted(m, shift) + o.l * exp_shifted(o.m, shift);
    m = m_new;
  }

  // Finalize an element: exp(x − m) / l. A row of only -inf gives 0/0 = NaN, like torch.softmax.
  __device__ __forceinline__ float normalize(float x) const { return exp_shifted(x, finite_or_zero(m)) / l; }
  // The same with 1/l computed once per row (one multiply per element instead of a division).
  __device__ __forceinline__ float normalize(float x, float inv_l) const {
    return exp_shifted(x, finite_or_zero(m)) * inv_l;
  }

  // log Σ exp(x): -inf for an empty row.
  __device__ __forceinline__ float lse() const { return l == 0.f ? -CUDART_INF_F : m + logf(l); }
};

__device__ __forceinline__ OnlineState merge(OnlineState a, const OnlineState& b) {
  a.merge(b);
  return a;
}

// All-reduce of the state across kWidth consecutive lanes (32: a warp; 4: the quad that shares a row
// of an mma fragment). One shfl_xor butterfly carries (m, l) together and merges at every step,
// instead of a max reduction followed by a sum reduction.
template <int kWidth = kWarpSize>
__device__ __forceinline__ OnlineState warp_allreduce(OnlineState s) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) {
    OnlineState o;
    o.m = __shfl_xor_sync(0xffffffffu, s.m, offset);
    o.l = __shfl_xor_sync(0xffffffffu, s.l, offset);
    s.merge(o);
  }
  return s;
}

template <int kWidth = kWarpSize>
__device__ __forceinline__ float warp_allreduce_max(float v) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

template <int kWidth = kWarpSize>
__device__ __forceinline__ float warp_allreduce_sum(float v) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// All-reduce across a block of kThreads (a multiple of 32, at most 1024): warps reduce, lane 0 of each
// parks its state in shared memory, then every warp reduces the parked states. Lanes past the warp
// count hold the identity (m = -inf, l = 0), never 0: a 0 max is wrong for an all-negative row.
// `smem` must hold kThreads / 32 states. The trailing barrier lets the caller reuse `smem` at once.
template <int kThreads>
__device__ __forceinline__ OnlineState block_allreduce(OnlineState s, OnlineState* smem) {
  static_assert(kThreads % kWarpSize == 0 && kThreads <= 1024, "block of whole warps");
  constexpr int kWarps = kThreads / kWarpSize;
  s = warp_allreduce(s);
  if constexpr (kWarps == 1) return s;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) smem[warp] = s;
  __syncthreads();
  s = lane < kWarps ? smem[lane] : OnlineState::identity();
  s = warp_allreduce(s);
  __syncthreads();
  return s;
}

// The same for a plain max or sum (the baseline kernels that reduce the two separately).
// `identity` is -inf for max and 0 for sum.
template <int kThreads, typename Op>
__device__ __forceinline__ float block_allreduce(float v, float* smem, float identity, Op op) {
  constexpr int kWarps = kThreads / kWarpSize;
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if constexpr (kWarps == 1) return v;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < kWarps ? smem[lane] : identity;
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  __syncthreads();
  return v;
}

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

// ---------------------------------------------------------------------------------------------
// Attention: the row state of a query row whose scores arrive a tile at a time. FlashAttention-2's
// softmax_rescale_o in two verbs. Scores are pre-multiplied by softmax_scale·log2 e by the caller
// (one FMA per score), so here m is in log2 units and exp is a bare exp2f.
// ---------------------------------------------------------------------------------------------
// exp2 on the SFU alone (ex2.approx.ftz.f32, ~2 ulp like exp2f). Outside --use_fast_math exp2f adds a
// compare and two multiplies per call to keep subnormal results; this flushes a result below 2^-126
// to 0 instead. Used where the result is a probability next to a row maximum of 1 (AttnRowState::
// p_ftz), so a flushed term is below 2^-126 of the sum and changes nothing.
__device__ __forceinline__ float exp2_ftz(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);  // host pass of nvcc, and the CPU emulator of the attention kernel
#endif
}

struct AttnRowState {
  float m;  // running max of the log2-unit scores (consistent across the threads sharing the row)
  float l;  // this thread's partial sum of exp2(s − m); all-reduced only at finalize

  static __device__ __forceinline__ AttnRowState identity() { return {-CUDART_INF_F, 0.f}; }

  // A new tile's row max (already all-reduced across the row's threads) arrives: move m to m' and
  // return alpha = exp2(m − m'), the factor that rescales l and the output accumulator. The caller
  // then computes p = exp2(s − shift()) and adds Σp with add().
  __device__ __forceinline__ float rescale(float tile_max) {
    const float m_new = fmaxf(m, tile_max);
    const float alpha = exp2f(m - finite_or_zero(m_new));
    m = m_new;
    l *= alpha;
    return alpha;
  }
  __device__ __forceinline__ float shift() const { return finite_or_zero(m); }
  __device__ __forceinline__ float p(float s) const { return exp2f(s - shift()); }
  // p() for the per-score hot loop of the attention tile kernel: one SFU op (exp2_ftz above).
  __device__ __forceinline__ float p_ftz(float s) const { return exp2_ftz(s - shift()); }
  __device__ __forceinline__ void add(float partial_sum) { l += partial_sum; }

  // Finalize after the row's threads summed l (warp_allreduce_sum<kWidth>): returns 1/l (0 for a row
  // with no visible key, so the output is 0) and writes lse in natural units (-inf for that row).
  __device__ __forceinline__ float finalize(float& lse_out) const {
    const bool empty = l == 0.f;  // NaN inputs keep propagating, like torch
    lse_out = empty ? -CUDART_INF_F : (m + log2f(l)) * kLn2;
    return empty ? 0.f : 1.f / l;
  }
};

// ---------------------------------------------------------------------------------------------
// The same two all-reduces for a block size known only at run time (blockDim.x, whole warps): the
// softmax ladder takes its block size from the launch-config table (tiled_attn/configs.py) instead of
// instantiating one kernel per size. `num_warps` = blockDim.x / 32; `smem` holds 32 entries.
__device__ __forceinline__ OnlineState block_allreduce(OnlineState s, OnlineState* smem, int num_warps) {
  s = warp_allreduce(s);
  if (num_warps == 1) return s;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) smem[warp] = s;
  __syncthreads();
  s = lane < num_warps ? smem[lane] : OnlineState::identity();
  s = warp_allreduce(s);
  __syncthreads();
  return s;
}

template <typename Op>
__device__ __forceinline__ float block_allreduce(float v, float* smem, int num_warps, float identity, Op op) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (num_warps == 1) return v;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < num_warps ? smem[lane] : identity;
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  __syncthreads();
  return v;
}

// ---------------------------------------------------------------------------------------------
// A running state whose sum carries a compensation term, for a thread that folds very many pieces
// one after another (the thread-per-row rungs, tile2d's tile-by-tile merge, long strided slices).
// A plain float sum of n terms drifts by ~sqrt(n)·eps relative (~6e-5 at n = 2^20), 100× what
// torch's tree reductions leave, and the numerics rule (DESIGN §4) allows 2×. Neumaier's variant
// of Kahan summation keeps the lost low-order part of every addition in `c` (rescaled with l when
// the max moves), so the error stays O(eps) at any n. The __f*_rn intrinsics are never contracted
// into FMAs, which would change what the compensation measures. update() / merge() take the same
// inputs as OnlineState's and reuse its verbs for the max and the exponentials.
// ---------------------------------------------------------------------------------------------
struct CompensatedState {
  OnlineState s;  // (m, l), l without the compensation
  float c;        // what the additions into l lost

  static __device__ __forceinline__ CompensatedState identity() { return {OnlineState::identity(), 0.f}; }

  __device__ __forceinline__ void merge(const OnlineState& o) {
    const float m_new = fmaxf(s.m, o.m);
    const float shift = finite_or_zero(m_new);
    const float a = exp_shifted(s.m, shift);  // exactly 1 while the max stays put
    const float l = __fmul_rn(s.l, a);
    const float b = __fmul_rn(o.l, exp_shifted(o.m, shift));
    const float t = __fadd_rn(l, b);
    const float lost = fabsf(l) >= fabsf(b) ? __fadd_rn(__fsub_rn(l, t), b) : __fadd_rn(__fsub_rn(b, t), l);
    c = __fadd_rn(__fmul_rn(c, a), lost);
    s.m = m_new;
    s.l = t;
  }
  __device__ __forceinline__ void update(float x) {
    OnlineState t = OnlineState::identity();
    t.update(x);
    merge(t);
  }
  template <int N>
  __device__ __forceinline__ void update(const float (&x)[N]) {
    OnlineState t = OnlineState::identity();
    t.update(x);
    merge(t);
  }
  // The plain state (l with its compensation folded in), for the merges and normalize that follow.
  __device__ __forceinline__ OnlineState state() const { return {s.m, s.l + c}; }
};

}  // namespace tiled_attn
