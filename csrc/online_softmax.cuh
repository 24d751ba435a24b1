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
//
// Error budget of a float32 softmax (DESIGN §4: max|ours − ref| <= 2·max|torch − ref| + eps(fp32),
// eps = 2^-23 = one ulp of 1.0, i.e. 2 ulps of an output in [0.5, 1), 4 in [0.25, 0.5)). torch's
// CUDA softmax takes the row max first, then Σ exp(x − max) (expf, per-thread sequential sums, a
// warp tree), then divides: on the largest output its error is about an ulp, so our margin is a
// few ulps, not more. Where ours can lose them, and what each verb below does about it:
//  * each exponential: exp2f (ex2.approx) and torch's expf are both within 2 ulp (CUDA Programming
//    Guide); exp2f((x − m)·log2 e) adds the product's rounding, |x − m|·2^-24 relative (at most
//    e^-1·2^-24 absolute on an output e^-(m−x)). For float32 outputs the output's exponential is
//    torch's own expf(x − m) (exp_out), so the exponentials agree with torch's and the two
//    results differ only through l; for 16-bit outputs exp2f's one SFU op.
//  * l, the sum: every time a partial sum is rescaled by exp(m_old − m_new) it takes another
//    exponential's 2 ulps. A merge butterfly rescales a lane's partial at each level its group's max
//    moves (up to log2(32) = 5 in a warp, 5 more across warps), on partials that can carry half of
//    l: that was warp_row's 4-ulp failure at 5 × 1000. So the all-reduces below take the max first
//    and rescale each partial once (warp_allreduce), the register-cached rows take the row max
//    before any exponential and never rescale (update_at_max), and a rescale by a max that did not
//    move is exactly 1, never exp2f(0) (rescale_factor).
//  * the additions: a float sum rounds at every step, and the one term that matters most, the row
//    max's exp(0) = 1 (half or more of l in a peaked row), passes through every addition on its
//    path: 7 roundings of ~l in a 128-thread block (warp tree 5 + block 2), up to 3.5 ulps, ~1
//    typical; the CPU emulator caught block_shuffle at 3 ulps of a 0.89 output where its float32
//    torch-like sum happened to be exact. So the cross-thread all-reduces add l in double
//    (warp_allreduce: one rounding to float per level, at most two per row, for twice the
//    shuffles of a float sum tree), a register-cached row sums its exponentials in double
//    (sum_f64: a convert and an add per element on the FP64 pipe, which an H100 SM runs at 64 a
//    clock: under 10% of it at full memory bandwidth), a streamed tile adds pairwise (log2 of its
//    16-32 terms), and threads that fold many tiles one after another use CompensatedState
//    (O(2^-24) at any count).
//  * the normalize: e · (1/l) rounds twice (1 ulp), e / l once (0.5 ulp). Float32 outputs get the
//    correctly rounded quotient (normalize_exp), 16-bit outputs the product: their own rounding
//    (2^-9 or 2^-12 relative) dwarfs the difference.
// A float64 model of warp_row at 5 × 1000, 4·randn (ex2.approx and expf as uniform ±1-2 ulp noise,
// 150-300 draws a setting) put the old online butterfly past the rule in 13-32% of draws (up to 3×
// the allowed error), and the max-first order of operations at <= 0.93× of it (0.99× with exp2f
// outputs), both with float sums; the double sums above only take error out.
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

// exp(x − shift) for an output element. kAccurate (float32 outputs): CUDA's expf of the rounded
// difference, the very function torch's softmax calls on the same difference, so the exponentials
// match torch's and only the sum's order differs (expf reduces its argument exactly: no product
// rounding; ~10 instructions, within a memory-bound kernel's budget). Else exp_shifted (16-bit
// outputs, whose rounding hides the difference).
template <bool kAccurate>
__device__ __forceinline__ float exp_out(float x, float shift) {
  if constexpr (kAccurate) return expf(x - shift);
  else return exp_shifted(x, shift);
}

// exp(m_old − m_new), the factor that moves a sum taken against m_old to the max m_new >= m_old:
// exactly 1 when the max did not move (no exponential's error on a sum that needs no rescale; -inf
// to -inf is 1 too, harmless on the identity's l = 0). A NaN m_old compares unequal and stays NaN.
__device__ __forceinline__ float rescale_factor(float m_old, float m_new) {
  return m_old == m_new ? 1.f : exp_shifted(m_old, finite_or_zero(m_new));
}

// Σ term(i) for i < N, accumulated in double: exact for any tile of float exponentials a thread
// holds (N·2^-53 relative), rounded to float by the caller once (see the error budget at the top).
template <int N, typename Term>
__device__ __forceinline__ double sum_f64(const Term& term) {
  double sum = 0.0;
#pragma unroll
  for (int i = 0; i < N; ++i) sum += static_cast<double>(term(i));
  return sum;
}

// Σ term(i) for i in [kLo, kHi) in float as a balanced tree: a term passes through log2(n)
// roundings instead of up to n − 1, for the same additions and no wider registers.
template <int kLo, int kHi, typename Term>
__device__ __forceinline__ float pairwise_sum(const Term& term) {
  if constexpr (kHi - kLo == 1) {
    return term(kLo);
  } else {
    constexpr int kMid = (kLo + kHi) / 2;
    return pairwise_sum<kLo, kMid>(term) + pairwise_sum<kMid, kHi>(term);
  }
}

struct OnlineState {
  float m;  // running max
  float l;  // running sum of exp(x − m)

  static __device__ __forceinline__ OnlineState identity() { return {-CUDART_INF_F, 0.f}; }

  // Fold one element.
  __device__ __forceinline__ void update(float x) {
    const float m_new = fmaxf(m, x);
    l = l * rescale_factor(m, m_new) + exp_shifted(x, finite_or_zero(m_new));
    m = m_new;
  }

  // Fold a tile held in registers: one max, one rescale, N exponentials added pairwise (the
  // streaming kernels' tiles are 16-32 values: 4-5 roundings on a term's path).
  template <int N>
  __device__ __forceinline__ void update(const float (&x)[N]) {
    const float m_new = fmaxf(m, max_of(x).m);
    const float shift = finite_or_zero(m_new);
    l = l * rescale_factor(m, m_new) + pairwise_sum<0, N>([&](int i) { return exp_shifted(x[i], shift); });
    m = m_new;
  }

  // (max of the tile, 0): a state that has seen the tile's max and nothing else. All-reduced, it
  // gives the row max that update_at_max needs.
  template <int N>
  static __device__ __forceinline__ OnlineState max_of(const float (&x)[N]) {
    float tile_max = x[0];
#pragma unroll
    for (int i = 1; i < N; ++i) tile_max = fmaxf(tile_max, x[i]);
    return {tile_max, 0.f};
  }

  // Fold a tile none of whose elements exceeds m, m being already the max of the whole row (a row
  // held on chip whole: its max is all-reduced first). No rescale, ever: every term is exp(x − m)
  // against the final max, as torch computes it. The tile is overwritten with those exponentials,
  // which normalize_exp turns into outputs without a second exponential. States built this way
  // share m, so merging them only adds their l. kAccurate: see exp_out.
  template <bool kAccurate, int N>
  __device__ __forceinline__ void update_at_max(float (&x)[N]) {
    const float shift = finite_or_zero(m);
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = exp_out<kAccurate>(x[i], shift);
    l = static_cast<float>(static_cast<double>(l) + sum_f64<N>([&](int i) { return x[i]; }));
  }

  // l taken against a max m_new >= m instead (one rescale; exactly l when m_new == m).
  __device__ __forceinline__ float l_at(float m_new) const { return l * rescale_factor(m, m_new); }

  // Fold another state (disjoint part of the same row).
  __device__ __forceinline__ void merge(const OnlineState& o) {
    const float m_new = fmaxf(m, o.m);
    l = l * rescale_factor(m, m_new) + o.l * rescale_factor(o.m, m_new);
    m = m_new;
  }

  // Finalize an element: exp(x − m) / l. A row of only -inf gives 0/0 = NaN, like torch.softmax.
  __device__ __forceinline__ float normalize(float x) const { return exp_shifted(x, finite_or_zero(m)) / l; }
  // Finalize an exponential e = exp(x − m) already taken (update_at_max), with inv_l = 1/l (the
  // IEEE division, once per row). kAccurate (float32 outputs): e / l correctly rounded, by one
  // Markstein correction of q = e·inv_l (q' = q + (e − q·l)·inv_l with the residual exact in an
  // FMA: correctly rounded when inv_l is the rounded reciprocal and q within an ulp, which it is;
  // l >= 1 for any row with a finite max, and 0 or NaN rows stay NaN). Three FP32 ops instead of
  // div.rn's sequence and its slow-path call (which spilled a register in block_row_smem). Else
  // e · inv_l: its second rounding a 16-bit output cannot show. See the error budget at the top.
  template <bool kAccurate>
  __device__ __forceinline__ float normalize_exp(float e, float inv_l) const {
    const float q = e * inv_l;
    if constexpr (kAccurate) return fmaf(fmaf(-q, l, e), inv_l, q);
    else return q;
  }
  // exp(x − m) / l, the exponential and the division as above.
  template <bool kAccurate>
  __device__ __forceinline__ float normalize(float x, float inv_l) const {
    return normalize_exp<kAccurate>(exp_out<kAccurate>(x, finite_or_zero(m)), inv_l);
  }

  // log Σ exp(x): -inf for an empty row.
  __device__ __forceinline__ float lse() const { return l == 0.f ? -CUDART_INF_F : m + logf(l); }
};

__device__ __forceinline__ OnlineState merge(OnlineState a, const OnlineState& b) {
  a.merge(b);
  return a;
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

// All-reduce of the state across kWidth consecutive lanes (a warp, or the 4/8/16-lane groups of
// warp_row's short rows): the max first, then each lane's l rescaled once to it (exactly 1 on the
// lane that holds the max) and summed in double, rounded to float once. A merge butterfly would
// rescale a partial at every level its max moved, and round the sum at every level.
template <int kWidth = kWarpSize>
__device__ __forceinline__ OnlineState warp_allreduce(OnlineState s) {
  const float m = warp_allreduce_max<kWidth>(s.m);
  double l = s.l_at(m);
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) l += __shfl_xor_sync(0xffffffffu, l, offset);
  return {m, static_cast<float>(l)};
}

// All-reduce across a block of whole warps (num_warps = blockDim.x / 32, at most 32): warps reduce,
// lane 0 of each parks its state in shared memory, then every warp reduces the parked states. Lanes
// past the warp count hold the identity (m = -inf, l = 0), never 0: a 0 max is wrong for an
// all-negative row. `smem` holds num_warps states; the trailing barrier lets the caller reuse it at
// once. The softmax ladder passes a block size from its launch-config table (tiled_attn/configs.py)
// at run time; the kThreads overloads below fix it at compile time (the branch folds away).
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

// The same for a plain max or sum (the baseline kernels that reduce the two separately).
// `identity` is -inf for max and 0 for sum.
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

template <int kThreads>
__device__ __forceinline__ OnlineState block_allreduce(OnlineState s, OnlineState* smem) {
  static_assert(kThreads % kWarpSize == 0 && kThreads <= 1024, "block of whole warps");
  return block_allreduce(s, smem, kThreads / kWarpSize);
}

template <int kThreads, typename Op>
__device__ __forceinline__ float block_allreduce(float v, float* smem, float identity, Op op) {
  static_assert(kThreads % kWarpSize == 0 && kThreads <= 1024, "block of whole warps");
  return block_allreduce(v, smem, kThreads / kWarpSize, identity, op);
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

  // The same two steps for scores not yet in log2 units (FA2's scale_apply_exp2): the caller takes
  // the tile max of the raw scores s and passes c = softmax scale·log2 e, which must be > 0 so that
  // c·max(s) is the max of c·s. p = exp2(s·c − m) is then one FFMA (product and shift rounded once)
  // and one SFU op per score, instead of a multiply per score before the max and a subtract after.
  __device__ __forceinline__ float rescale_raw(float raw_tile_max, float c) { return rescale(raw_tile_max * c); }
  __device__ __forceinline__ float p_raw_ftz(float s, float c) const { return exp2_ftz(fmaf(s, c, -shift())); }

  // Split-KV (flash-decoding): the merge of §1 over S partial states (m_s, l_s, acc_s) of one row,
  // each from a disjoint key range, written max first like warp_allreduce so every partial is
  // rescaled exactly once (a chain of pairwise merges would rescale the running sum at every split
  // whose max is larger):
  //   m = max_s m_s                  (merge_max, from identity(), over every partial)
  //   l = Σ_s l_s·exp2(m_s − m)      (merge_add per partial; it returns the weight exp2(m_s − m),
  //   acc = Σ_s w_s·acc_s             which the caller applies to the partial's accumulator)
  // then finalize() as for a row computed whole. The weight is exactly 1 where m_s == m, and a
  // partial that saw no key (the identity: m_s = -inf, l_s = 0, acc_s = 0) adds exactly 0: its weight
  // is exp2(-inf − m) = 0, or 1 when every partial is empty (m = -inf), times l_s = 0 and acc_s = 0;
  // such a row finalizes to output 0 and lse -inf. A NaN partial (NaN scores) makes its weight NaN,
  // so the row's output is NaN, like torch.
  __device__ __forceinline__ void merge_max(float m_s) { m = fmaxf(m, m_s); }
  __device__ __forceinline__ float merge_add(float m_s, float l_s) {
    const float w = m_s == m ? 1.f : exp2f(m_s - shift());
    l += l_s * w;
    return w;
  }

  // Finalize after the row's threads summed l (warp_allreduce_sum<kWidth>): returns 1/l (0 for a row
  // with no visible key, so the output is 0) and writes lse in natural units (-inf for that row).
  __device__ __forceinline__ float finalize(float& lse_out) const {
    const bool empty = l == 0.f;  // NaN inputs keep propagating, like torch
    lse_out = empty ? -CUDART_INF_F : (m + log2f(l)) * kLn2;
    return empty ? 0.f : 1.f / l;
  }
};


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
    const float a = rescale_factor(s.m, m_new);  // exactly 1 while the max stays put
    const float l = __fmul_rn(s.l, a);
    const float b = __fmul_rn(o.l, rescale_factor(o.m, m_new));
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
