// flash_bwd_sm90_kernel.cuh: the attention backward on Hopper's warpgroup MMA (wgmma, sm_90a), with the
// warp-specialized forward's producer (flash_fwd_sm90_ws_kernel.cuh) and FlashAttention-2's loop order:
// a CTA owns kBlockN = 128 keys of one (batch, kv head), keeps K and V resident, and walks the query
// tiles (kBlockM = 64 rows, or 128 at D = 64: BwdTraits) of every query head of its GQA group, so dK
// and dV are summed over the group in registers and written once. dQ is added to a float32
// accumulator by TMA reduce-adds from shared memory (atomic adds at L2: the default backward's dQ;
// deterministic=True keeps the Triton pass).
//   warpgroup 0, the producer: one thread loads K and V once (TMA, one mbarrier), then Q and dO of
//     each query tile into a kStages ring ("full" / "empty" mbarriers per slot, as in the forward);
//     its warp 1, the dQ writer, issues the consumers' dQ reduce-adds (below).
//   warpgroups 1 and 2, the consumers: 64 keys each (rows 64cw.. of the K / V tile). Per query tile:
//     Sᵀ  = K Qᵀ      wgmma SS (A = K, B = Q: both K-major)                 64 keys x kBlockM queries
//     dPᵀ = V dOᵀ     wgmma SS (A = V, B = dO)
//     Pᵀ  = exp2(Sᵀ·scale·log2 e − lse·log2 e), masked to 0 where a key is not visible
//     dSᵀ = Pᵀ ∘ (dPᵀ − delta)
//     dV += Pᵀ dO     wgmma RS (A = Pᵀ from registers, B = dO MN-major)     64 keys x D
//     dK += dSᵀ Q     wgmma RS (A = dSᵀ, B = Q MN-major)
//     dQ  = dS K      wgmma SS (A = dS from shared memory, MN-major; B = K MN-major) over all 128 keys
//                     of the CTA: 64 query rows x D / 2 columns per consumer (kBlockM = 64), or its
//                     64 rows x D (kBlockM = 128)
//   then dQ into this consumer's dQ buffer in shared memory, 8 bytes a lane as the accumulator holds
//   it, and a bar.arrive: the writer warp, waiting there (bar.sync), issues the TMA reduce-add of it
//   into the accumulator (cp.reduce.async.bulk.tensor, 64 rows x 32 columns a box) and, once the
//   reduce has read the buffer, arrives at the consumer's "dQ empty" barrier, where the consumer waits
//   before its next tile's stores (FA3's dQ hand-off). Computing Sᵀ and dPᵀ (keys as the wgmma's
//   M) puts Pᵀ and dSᵀ in the accumulator layout that is exactly the register A fragment of the dV
//   and dK products (flash_fwd_sm90_kernel.cuh pack_p), so neither goes through shared memory; only
//   dS does, for dQ, which needs all 128 keys: both consumers store their dSᵀ rows (64 keys each) into
//   one of two dS buffers and meet at a named barrier (the producer warp is not in it).
// Overlap: dPᵀ runs while Pᵀ's exponentials do; at D = 64 with kBlockM = 64 (kEarly) the next tile's
// Sᵀ and dPᵀ are issued before this tile's dQ stores. The two consumers stay in step (the named
// barrier).
// Why dQ goes through shared memory: red.global.add.v4 from every thread (2048 16-byte requests a
// tile at D = 128) kept L2 71% busy and the tensor pipe at 42% (ncu, H100, 2026-11-28); a TMA
// reduce-add is a few bulk requests, issued by one thread, that the MMA warps do not wait for (L2
// 44% busy after, ncu on an H200; the whole backward 1.06-1.12x faster at D = 128 there).
// Why a writer warp: before it (kDqWriter false), each consumer paired lanes for 16-byte stores, met
// its own 128 threads at a named barrier and issued the reduce itself; that hand-off held 23% of the
// warp-stall samples (ncu source counters, H200, session 29). With the writer the consumers store and
// go on: the whole backward 1.10-1.13x faster at D = 128 and 1.13-1.18x at D = 64 (H200, session 30,
// benchmarks/results/2026-11-29-h200-s30-tune-cuda-bwd-dq-writer.txt; ncu D = 128 N = 4096: 3.09 ->
// 2.62 ms, tensor pipe 45.9 -> 54.2%, short-scoreboard stalls 1.46 -> 0.73 cycles an instruction).
// Why the two dS buffers suffice: a consumer writes buffer it % 2 after it waited for its own dQ
// product of tile it − 2, and the barrier of tile it − 1 (which both passed) came after the other
// consumer's wait for that product.
// Rows and keys past the ends: TMA zero-fills Q and dO rows past Nq and K and V rows past Nk; lse reads
// as +inf past Nq (so P = 0 there), and P is masked to 0 for keys past Nk and across the causal
// diagonal (bottom-right: key j visible from query i iff j <= i + causal_offset); a row with no visible
// key (lse −inf) is all masked. Tiles the causal mask cannot reach are not masked at all.
// Every tile in shared memory is 1024-byte aligned and laid out as in the forward (128-byte swizzle,
// 64-column blocks: flash_fwd_sm90_kernel.cuh); the dS buffer is dSᵀ row-major (128 keys x kBlockM
// queries, one column block per 64 queries), which is dS MN-major for the dQ product.
// tests/emulation/flash_bwd_sm90_emulator.cpp runs this kernel on the CPU against a float64 reference.
#pragma once

#include "flash_bwd_sm90.cuh"
#include "flash_fwd_sm90_kernel.cuh"
#include "tma.cuh"

namespace tiled_attn {
namespace flash_fwd_sm90 {

// kBlockM: query rows per step, 64, or 128 (D = 64 only: Sᵀ and dPᵀ take 64 registers each). With 64
// rows the two consumers split dQ by columns (D / 2 each), with 128 by rows (64 each, all D columns).
#ifndef TILED_ATTN_BWD_DQ_WRITER
#define TILED_ATTN_BWD_DQ_WRITER 1
#endif

template <int kHeadDim_, int kBlockM_ = 64, bool kDqWriter_ = TILED_ATTN_BWD_DQ_WRITER>
struct BwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = 128;  // keys per CTA: two consumers of 64 (wgmma's M)
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = (kConsumers + 1) * 128;
  static constexpr int kConsumerThreads = kConsumers * 128;
  static constexpr int kSRegs = kBlockM / 2;      // Sᵀ and dPᵀ accumulators (64 keys x kBlockM)
  static constexpr int kPVSteps = kBlockM / 16;   // k steps (queries) of the dV and dK products
  static constexpr int kAccRegs = kHeadDim / 2;   // dV and dK accumulators (64 keys x D)
  static constexpr bool kDqByRows = kBlockM == 128;
  static constexpr int kDqCols = kDqByRows ? kHeadDim : kHeadDim / 2;  // each consumer's dQ columns
  static constexpr int kDqRegs = kDqCols / 2;                          // (of 64 rows)
  static constexpr int kQKSteps = kHeadDim / 16;  // k steps (head dim) of Sᵀ and dPᵀ
  static constexpr int kDqSteps = kBlockN / 16;   // k steps (keys) of dQ
  static constexpr int kColBlocks = kHeadDim / 64;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;  // one Q or dO tile
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;
  static constexpr int kLdBytes = 2 * kBlockM * 4;  // a query tile's lse and delta
  // dQ of a query tile in float32, both consumers' shares: each 64 rows x kDqCols, in boxes of 32
  // columns (one 128-byte swizzle row, the reduce's box) of 64 rows.
  static constexpr int kDqBytes = kBlockM * kHeadDim * 4;
  static constexpr int kDqBoxBytes = 64 * 128;
  static constexpr int kDqBoxes = kDqCols / 32;  // per consumer
  static constexpr int kSmemLimit = 232448;
  // Ring depth: as many Q + dO slots as fit beside K, V, the two dS buffers and dQ's, at most 4 (3 at
  // D = 128 and at D = 64 with kBlockM = 128).
  static constexpr int kStages = std::min(
      4, (kSmemLimit - 1024 - 2 * kKVBytes - 2 * kDsBytes - kDqBytes - 2 * kLdBytes - 8 * 9) / (2 * kQBytes));
  static constexpr int kBarriers = 1 + 2 * kStages;  // K/V full; per slot full and empty
  static constexpr int kSmemBytes =
      2 * kKVBytes + 2 * kStages * kQBytes + 2 * kDsBytes + kDqBytes + 2 * kLdBytes + 8 * kBarriers + 1024;
  // setmaxnreg budgets as in the forward with two consumers: dV and dK (D registers together), Sᵀ and
  // dPᵀ (kBlockM), their packed fragments and dQ live at once.
  // The next tile's Sᵀ and dPᵀ issued before this tile's dQ stores (which they then overlap), or at
  // the top of the next iteration. At D = 128 both in flight there spill (ptxas, nvcc 13.0: 384
  // bytes). Sᵀ alone no longer spills since dQ goes through shared memory (at D = 128 and at D = 64
  // with kBlockM = 128), but measured 10-18% slower there, issued after the dQ product or before
  // waiting for it (H200, benchmarks/results/2026-11-29-h200-s26-tune-cuda-bwd-early-s.txt).
  static constexpr bool kEarly = kHeadDim <= 64 && kBlockM == 64;
  // dQ's hand-off (the comment at the top): a writer warp of the producer warpgroup issues the
  // reduce-adds, the consumers store 8 bytes a lane and go on (bar.arrive); or (false, measured slower,
  // kept for A/B runs: -DTILED_ATTN_BWD_DQ_WRITER=0) each consumer pairs lanes for 16-byte stores,
  // meets its own 128 threads and issues its reduce itself.
  static constexpr bool kDqWriter = kDqWriter_;
  static constexpr int kHandOffThreads = 128 + kWarpSize;  // a consumer and the writer warp
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;

  static_assert(kHeadDim % 64 == 0, "whole 128-byte swizzle rows");
  static_assert(kBlockM == 64 || kBlockM == 128, "one or two 64-query column blocks of dS, one per consumer");
  static_assert(kDqCols % 32 == 0, "whole 32-column boxes of dQ");
  static_assert(kDqBytes == kConsumers * kDqBoxes * kDqBoxBytes, "dQ's buffer is the consumers' boxes");
  static_assert(kStages >= 2, "one slot loading while one is computed");
  static_assert(kSmemBytes <= kSmemLimit, "the sm90 opt-in shared memory limit");
  // setmaxnreg moves registers within what the launch gave the CTA (its threads x the per-thread count
  // ptxas allocates under __launch_bounds__(kThreads, 1): 168 at 384 threads), not the whole file: an
  // inc past it waits forever (a hang on the H200, session 30, with 32 + 240).
  static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumerThreads <= 65536 / kThreads / 8 * 8 * kThreads,
                "the registers the launch allocates");
};

// What a CTA computes: its keys [n0, n0 + kBlockN) of one (batch, kv head), and the query tiles that
// see any of them, for each query head of the group (iteration it: head head(it), rows m0(it)..).
// head_kv: the virtual head (BwdParams::kv_split) whose query heads the CTA walks and whose dK / dV it
// writes; K and V are those of kv head head_kv / kv_split.
template <class Tr>
struct BwdTile {
  int batch, head_kv, n0, m_first, per_head, n_iters, shift;

  __device__ __forceinline__ explicit BwdTile(const BwdParams& p) {
    int bx = static_cast<int>(blockIdx.x), by = static_cast<int>(blockIdx.y);
    if (p.longest_first) {
      // The launch order (x fastest) with the key tile slowest instead: every slot's key tile 0 (under a
      // causal mask the longest walk) starts before any slot's tile 1, as a longest-first schedule.
      const int64_t l = int64_t{by} * gridDim.x + bx;
      bx = static_cast<int>(l / gridDim.y);
      by = static_cast<int>(l % gridDim.y);
    }
    const int slot = p.bh_offset + by;
    batch = slot / p.heads_kv;
    head_kv = slot - batch * p.heads_kv;
    n0 = bx * Tr::kBlockN;  // x = 0 first: under causal masks the busiest CTA
    // The first query that sees key n0 (causal: i >= n0 − offset).
    const int first_q = p.causal ? static_cast<int>(clamp64(int64_t{n0} - p.causal_offset, 0, p.seqlen_q)) : 0;
    m_first = first_q / Tr::kBlockM;
    per_head = (p.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM - m_first;
    n_iters = per_head * p.group;
    // Each CTA starts its walk at another query tile (and wraps around): the CTAs of one head add
    // their dQ to different rows at a time, not all to the first tile's.
    shift = per_head > 0 ? bx % per_head : 0;
  }
  __device__ __forceinline__ int head(const BwdParams& p, int it) const { return head_kv * p.group + it / per_head; }
  __device__ __forceinline__ int m0(int it) const { return (m_first + (it + shift) % per_head) * Tr::kBlockM; }
  // Whether the tile at rows m0 needs the mask: keys past Nk, or a key above some row's diagonal.
  __device__ __forceinline__ bool masked(const BwdParams& p, int m0) const {
    return n0 + Tr::kBlockN > p.seqlen_k || (p.causal && int64_t{n0} + Tr::kBlockN - 1 > int64_t{m0} + p.causal_offset);
  }
};

template <class Tr, typename T>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    flash_bwd_sm90_kernel(const BwdParams p, const __grid_constant__ BwdMaps maps) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t sK = (smem_u32(smem_raw) + 1023u) & ~1023u;  // every tile 1024-byte aligned
  const uint32_t sV = sK + Tr::kKVBytes;
  const uint32_t sQ = sV + Tr::kKVBytes;                  // kStages slots
  const uint32_t sDO = sQ + Tr::kStages * Tr::kQBytes;    // kStages slots
  const uint32_t sDS = sDO + Tr::kStages * Tr::kQBytes;   // two buffers
  const uint32_t sDQ = sDS + 2 * Tr::kDsBytes;           // each consumer's dQ boxes
  const uint32_t sLD = sDQ + Tr::kDqBytes;               // two lse + delta buffers
  const uint32_t sBar = sLD + 2 * Tr::kLdBytes;
  const uint32_t bar_kv = sBar;
  auto full = [&](int s) { return sBar + 8u * (1 + s); };
  auto empty = [&](int s) { return sBar + 8u * (1 + Tr::kStages + s); };
  // Named barriers: 1 both consumers (dS); per consumer c its dQ hand-off (kDqWriter), or its own 128
  // threads before its reduce (dq_full(c) alone).
  auto dq_full = [](int c) { return 2 + c; };
  auto dq_empty = [](int c) { return 2 + Tr::kConsumers + c; };

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const BwdTile<Tr> cta(p);

  if (tid == 0) {
    mbar_init(bar_kv, 1);
#pragma unroll
    for (int s = 0; s < Tr::kStages; ++s) {
      mbar_init(full(s), 1);
      mbar_init(empty(s), Tr::kConsumerThreads);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer ----
    setmaxnreg_dec<Tr::kProducerRegs>();
    if (tid == 0) {
      // K and V even when no query tile sees them: the consumers wait for them before they exit, so
      // no TMA is in flight when the CTA ends.
      mbar_arrive_expect_tx(bar_kv, 2 * Tr::kKVBytes);
#pragma unroll
      for (int b = 0; b < Tr::kColBlocks; ++b) {
        tma_load_4d(sK + b * Tr::kBlockN * 128, &maps.k, bar_kv, 64 * b, cta.n0, cta.head_kv / p.kv_split, cta.batch);
        tma_load_4d(sV + b * Tr::kBlockN * 128, &maps.v, bar_kv, 64 * b, cta.n0, cta.head_kv / p.kv_split, cta.batch);
      }
      for (int it = 0; it < cta.n_iters; ++it) {
        const int s = it % Tr::kStages;
        mbar_wait(empty(s), ((it / Tr::kStages) & 1) ^ 1);  // round 0 passes (see the forward)
        const int head = cta.head(p, it), m0 = cta.m0(it);
        mbar_arrive_expect_tx(full(s), 2 * Tr::kQBytes);
#pragma unroll
        for (int b = 0; b < Tr::kColBlocks; ++b) {
          tma_load_4d(sQ + s * Tr::kQBytes + b * Tr::kBlockM * 128, &maps.q, full(s), 64 * b, m0, head, cta.batch);
          tma_load_4d(sDO + s * Tr::kQBytes + b * Tr::kBlockM * 128, &maps.dout, full(s), 64 * b, m0, head,
                      cta.batch);
        }
      }
    } else if (Tr::kDqWriter && tid / kWarpSize == 1) {
      // ---- the dQ writer: consumer c's buffer is "full" at barrier dq_full(c) (its 128 threads arrive
      // after their stores, this warp waits) and "empty" at dq_empty(c) (this warp arrives once the
      // reduce has read it, the consumer waits before its next stores). Both buffers start empty.
      // It walks the query tiles as the consumers do (cta.head, cta.m0). Only the dQ buffers pass
      // through the hand-off, read by the reduce (the async proxy, after the consumers' proxy fence):
      // the tile's coordinates posted in shared memory by a consumer instead made compute-sanitizer's
      // racecheck report its generic store and this warp's load, ordered by bar.arrive -> bar.sync
      // alone, as hazards (H200, session 30).
      const bool leader = tid == kWarpSize;
      if (cta.n_iters > 0) {
#pragma unroll
        for (int c = 0; c < Tr::kConsumers; ++c) named_barrier_arrive(dq_empty(c), Tr::kHandOffThreads);
      }
      for (int it = 0; it < cta.n_iters; ++it) {
        const int head = cta.head(p, it), m0 = cta.m0(it);
#pragma unroll
        for (int c = 0; c < Tr::kConsumers; ++c) {
          named_barrier_sync(dq_full(c), Tr::kHandOffThreads);
          if (leader) {
            // Rows past Nq are outside the map: the reduce skips them.
            const int col0 = Tr::kDqByRows ? 0 : c * Tr::kDqCols, row0 = Tr::kDqByRows ? c * 64 : 0;
#pragma unroll
            for (int b = 0; b < Tr::kDqBoxes; ++b)
              tma_reduce_add_4d(&maps.dq, sDQ + (c * Tr::kDqBoxes + b) * Tr::kDqBoxBytes, col0 + 32 * b, m0 + row0,
                                head, cta.batch);
            bulk_commit_group();
          }
        }
        // Both reduces have read their buffers (also before the CTA's shared memory goes away).
        if (leader) bulk_wait_group_read<0>();
        __syncwarp();
        if (it + 1 < cta.n_iters) {
#pragma unroll
          for (int c = 0; c < Tr::kConsumers; ++c) named_barrier_arrive(dq_empty(c), Tr::kHandOffThreads);
        }
      }
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<Tr::kConsumerRegs>();
  const int cw = wg - 1;  // this warpgroup's keys: rows 64cw .. 64cw + 63 of the K / V tile
  const int warp = (tid % 128) / kWarpSize, lane = tid % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int key_row = cw * 64 + warp * 16 + g;  // this thread's keys: tile rows key_row and key_row + 8
  const int key0 = cta.n0 + key_row;

  float dv[Tr::kAccRegs], dk[Tr::kAccRegs];
#pragma unroll
  for (int i = 0; i < Tr::kAccRegs; ++i) dv[i] = dk[i] = 0.f;

  // K-major A (this consumer's K / V rows) and B (Q / dO of slot 0); MN-major B (Q / dO for dK / dV,
  // K for dQ: this consumer's columns) and A (dS). K step kk of a K-major operand is 32 bytes into the
  // 128-byte rows of column block kk / 4; of an MN-major one, 16 rows (2048 bytes) on.
  const uint64_t desc_k = make_desc_sw128(sK + cw * 64 * 128, 16, 1024);
  const uint64_t desc_v = make_desc_sw128(sV + cw * 64 * 128, 16, 1024);
  const uint64_t desc_q = make_desc_sw128(sQ, 16, 1024);
  const uint64_t desc_do = make_desc_sw128(sDO, 16, 1024);
  const uint64_t desc_q_mn = make_desc_sw128(sQ, Tr::kBlockM * 128, 1024);
  const uint64_t desc_do_mn = make_desc_sw128(sDO, Tr::kBlockM * 128, 1024);
  // This consumer's share of dQ: rows dq_row0.. (64 of them) and columns dq_col0.. (kDqCols).
  const int dq_col0 = Tr::kDqByRows ? 0 : cw * Tr::kDqCols;
  const int dq_row0 = Tr::kDqByRows ? cw * 64 : 0;
  // Column dq_col0 of K: its column block, then (D = 64: 32 columns) 64 bytes into the 128-byte rows;
  // the swizzle applies to the address as a whole, as for the K-major k steps. dS rows dq_row0..: the
  // dS buffer's column block dq_row0 / 64.
  const uint64_t desc_k_mn =
      make_desc_sw128(sK + (dq_col0 / 64) * Tr::kBlockN * 128 + (dq_col0 % 64) * 2, Tr::kBlockN * 128, 1024);
  const uint64_t desc_ds = make_desc_sw128(sDS + (dq_row0 / 64) * Tr::kBlockN * 128, Tr::kBlockN * 128, 1024);

  // lse (log2 units; +inf where P must be 0: past Nq, or a row with no visible key) and delta of a
  // query tile, staged in shared memory one tile ahead (buffer it % 2: lse at 0, delta kBlockM floats
  // on): consumer thread ct < kBlockM loads lse of row ct, the next kBlockM delta, and stores it
  // before the named barrier of the tile before. Held in registers instead, the 2·kBlockM / 4 values
  // each thread needs pushed the D = 128 consumers past their 240 registers.
  const int ct = tid - 128;
  auto fetch = [&](int it) {
    const int64_t row = (int64_t{cta.batch} * p.heads_q + cta.head(p, it)) * p.seqlen_q;
    const int col = cta.m0(it) + ct % Tr::kBlockM;
    if (col >= p.seqlen_q) return ct < Tr::kBlockM ? CUDART_INF_F : 0.f;
    if (ct >= Tr::kBlockM) return p.delta[row + col];
    const float l = p.lse[row + col];
    return l == -CUDART_INF_F ? CUDART_INF_F : l * kLog2e;
  };
  auto stage = [&](int it, float v) { st_shared_b32(sLD + (it % 2) * Tr::kLdBytes + ct * 4, __float_as_uint(v)); };
  if (ct < 2 * Tr::kBlockM && cta.n_iters > 0) stage(0, fetch(0));
  named_barrier_sync(1, Tr::kConsumerThreads);

  // Sᵀ and dPᵀ of query tile it, one commit group each (dPᵀ still runs while Pᵀ's exponentials do).
  // With kEarly tile it + 1's are issued before tile it's dQ reductions, which then overlap them.
  float st[Tr::kSRegs], dpt[Tr::kSRegs];
  // acc = A Bᵀ over the head dim: A this consumer's K (or V) rows, B slot s's Q (or dO) tile.
  auto issue = [&](float (&acc)[Tr::kSRegs], uint64_t desc_a, uint64_t desc_b, int s) {
    wgmma_fence();  // orders the last reads of acc (packing) before the product overwrites it
#pragma unroll
    for (int kk = 0; kk < Tr::kQKSteps; ++kk) {
      const uint32_t k_off = (kk % 4) * 32;
      Wgmma<Tr::kBlockM, T>::template ss<0>(acc, desc_advance(desc_a, (kk / 4) * Tr::kBlockN * 128 + k_off),
                                           desc_advance(desc_b, s * Tr::kQBytes + (kk / 4) * Tr::kBlockM * 128 + k_off),
                                           kk > 0 ? 1 : 0);
    }
    wgmma_commit();
  };
  auto issue_s = [&](int it) {
    mbar_wait(full(it % Tr::kStages), (it / Tr::kStages) & 1);
    issue(st, desc_k, desc_q, it % Tr::kStages);
  };
  auto issue_dp = [&](int it) { issue(dpt, desc_v, desc_do, it % Tr::kStages); };  // after issue_s(it)

  mbar_wait(bar_kv, 0);
  if (Tr::kEarly && cta.n_iters > 0) {
    issue_s(0);
    issue_dp(0);
  }
  for (int it = 0; it < cta.n_iters; ++it) {
    const int s = it % Tr::kStages;
    const int head = cta.head(p, it), m0 = cta.m0(it);
    const bool prefetch = ct < 2 * Tr::kBlockM && it + 1 < cta.n_iters;
    const float next = prefetch ? fetch(it + 1) : 0.f;
    const uint32_t ld = sLD + (it % 2) * Tr::kLdBytes + 8 * t;  // columns 8j + 2t, + 1: 32j bytes on
    if constexpr (!Tr::kEarly) {
      issue_s(it);
      issue_dp(it);
    }

    wgmma_wait<1>();  // Sᵀ has landed; dPᵀ may still run
    fence_operands(st);
    // Column 8·(i / 4) + 2t + i % 2 of register i: one 8-byte shared load per column pair.
    auto lse2 = [&](int i) {
      const float2 v = ld_shared_f32x2(ld + 32 * (i / 4));
      return i % 2 ? v.y : v.x;
    };
    auto dl = [&](int i) {
      const float2 v = ld_shared_f32x2(ld + Tr::kBlockM * 4 + 32 * (i / 4));
      return i % 2 ? v.y : v.x;
    };

    // Pᵀ in place. Accumulator register i: key key0 + 8·((i / 2) % 2), query m0 + 8·(i / 4) + 2t + i % 2.
    if (cta.masked(p, m0)) {
#pragma unroll
      for (int i = 0; i < Tr::kSRegs; ++i) {
        const int key = key0 + 8 * ((i / 2) % 2);
        const int64_t col = m0 + 8 * (i / 4) + 2 * t + i % 2;
        const bool visible = key < p.seqlen_k && (!p.causal || key <= col + p.causal_offset);
        st[i] = visible ? exp2_ftz(fmaf(st[i], p.scale_log2, -lse2(i))) : 0.f;
      }
    } else {
#pragma unroll
      for (int i = 0; i < Tr::kSRegs; ++i) st[i] = exp2_ftz(fmaf(st[i], p.scale_log2, -lse2(i)));
    }
    wgmma_wait<0>();
    fence_operands(dpt);
    // dSᵀ in place of Pᵀ once Pᵀ is packed (fewer registers live at once: Bm = 128 spilled otherwise).
    uint32_t pa[Tr::kPVSteps][4], da[Tr::kPVSteps][4];
    pack_p<Tr, T>(st, pa);
#pragma unroll
    for (int i = 0; i < Tr::kSRegs; ++i) st[i] *= dpt[i] - dl(i);
    pack_p<Tr, T>(st, da);
    fence_operands(dv);
    fence_operands(dk);
    fence_operands(pa);
    fence_operands(da);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Tr::kPVSteps; ++kk)
      Wgmma<Tr::kHeadDim, T>::template rs<1>(dv, pa[kk], desc_advance(desc_do_mn, s * Tr::kQBytes + kk * 16 * 128), 1);
#pragma unroll
    for (int kk = 0; kk < Tr::kPVSteps; ++kk)
      Wgmma<Tr::kHeadDim, T>::template rs<1>(dk, da[kk], desc_advance(desc_q_mn, s * Tr::kQBytes + kk * 16 * 128), 1);
    wgmma_commit();

    // dSᵀ rows into dS buffer it % 2 (reading da while the dK product reads it too is allowed): fragment
    // register r of k step kk is key row key_row + 8·(r % 2), queries 16kk + 8·(r / 2) + 2t (+1), i.e.
    // the 16-byte chunk 2kk + r / 2 of that row, 4t bytes in.
    const uint32_t ds = sDS + (it % 2) * Tr::kDsBytes;
#pragma unroll
    for (int kk = 0; kk < Tr::kPVSteps; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r)
        st_shared_b32(ds + swizzled_offset<Tr::kBlockN>(key_row + 8 * (r % 2), 2 * kk + r / 2) + 4 * t, da[kk][r]);
    if (prefetch) stage(it + 1, next);
    fence_proxy_async();
    if (!Tr::kDqWriter && it > 0 && ct % 128 == 0) bulk_wait_group_read<0>();  // the last tile's dQ boxes were read
    named_barrier_sync(1, Tr::kConsumerThreads);  // both consumers' 64 keys of dS (and the next lse) are in

    float dq[Tr::kDqRegs];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Tr::kDqSteps; ++kk)
      Wgmma<Tr::kDqCols, T>::template ss<1, 1>(dq, desc_advance(desc_ds, (it % 2) * Tr::kDsBytes + kk * 16 * 128),
                                              desc_advance(desc_k_mn, kk * 16 * 128), kk > 0 ? 1 : 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(dq);
    fence_operands(dv);
    fence_operands(dk);
    mbar_arrive(empty(s));  // this thread's reads of Q and dO (slot s) are done
    if (Tr::kEarly && it + 1 < cta.n_iters) {
      issue_s(it + 1);
      issue_dp(it + 1);
    }

    // dQ: register i is query m0 + dq_row0 + 16·warp + g + 8·((i / 2) % 2), column dq_col0 + 8·(i / 4)
    // + 2t (+1), into box c / 32 of this consumer's buffer at row r, 16-byte chunk (c % 32) / 4 XOR r % 8
    // (the 128-byte swizzle the map reads it with).
    const uint32_t dq_buf = sDQ + cw * Tr::kDqBoxes * Tr::kDqBoxBytes;
    if constexpr (Tr::kDqWriter) {
      // Each register pair as it lies, 8 bytes a lane: a warp's store is 8 rows x 32 bytes, rows g and
      // g ^ 1 on the same two chunks, so two wavefronts (256 bytes), no cross-lane pairing.
      // Column 8j + 2t is chunk 2(j % 4) + t / 2 of box j / 4, byte 8(t % 2): XORed with the row's
      // r % 8 = g, the chunk is 2(j % 4) XORed into this thread's chunk of j = 0.
      const uint32_t dq_at = dq_buf + (warp * 16 + g) * 128 + (((t >> 1) ^ g) * 16) + 8 * (t & 1);
      named_barrier_sync(dq_empty(cw), Tr::kHandOffThreads);  // the writer's reduce has read the buffer
#pragma unroll
      for (int i = 0; i < Tr::kDqRegs; i += 2) {
        const int j = i / 4;  // row + 8 for (i / 2) % 2
        const uint32_t a = (dq_at ^ ((j % 4) * 32)) + (j / 4) * Tr::kDqBoxBytes + ((i / 2) % 2) * 8 * 128;
        st_shared_f32x2(a, dq[i], dq[i + 1]);
      }
      fence_proxy_async();
      named_barrier_arrive(dq_full(cw), Tr::kHandOffThreads);  // the writer warp takes it from here
    } else {
      // Lanes t and t ^ 1 swap a pair so that each holds four adjacent columns of one row (even t: row
      // g, columns 8j + 2t..+3; odd t: row g + 8, columns 8j + 2t − 2..+1): one 16-byte store (rows r
      // and r + 8 share a bank group: two-way conflicts).
      const bool odd = t & 1;
      const int r = warp * 16 + g + (odd ? 8 : 0);
      // Column 8j + 2(t & ~1) is chunk 2(j % 4) + t / 2 of box j / 4: the chunk's XOR with r % 8 is
      // 2(j % 4) XORed into this thread's chunk of j = 0.
      const uint32_t dq_at = dq_buf + r * 128 + (((t >> 1) ^ (r % 8)) * 16);
#pragma unroll
      for (int j = 0; j < Tr::kDqRegs / 4; ++j) {
        const float x = __shfl_xor_sync(0xffffffffu, odd ? dq[4 * j] : dq[4 * j + 2], 1);
        const float y = __shfl_xor_sync(0xffffffffu, odd ? dq[4 * j + 1] : dq[4 * j + 3], 1);
        const uint32_t a = (dq_at ^ ((j % 4) * 32)) + (j / 4) * Tr::kDqBoxBytes;
        if (odd) st_shared_f32x4(a, x, y, dq[4 * j + 2], dq[4 * j + 3]);
        else st_shared_f32x4(a, dq[4 * j], dq[4 * j + 1], x, y);
      }
      fence_proxy_async();
      named_barrier_sync(dq_full(cw), 128);  // this consumer's dQ is in its buffer
      if (ct % 128 == 0) {
        // Rows past Nq are outside the map: the reduce skips them.
#pragma unroll
        for (int b = 0; b < Tr::kDqBoxes; ++b)
          tma_reduce_add_4d(&maps.dq, dq_buf + b * Tr::kDqBoxBytes, dq_col0 + 32 * b, m0 + dq_row0, head, cta.batch);
        bulk_commit_group();
      }
    }
  }
  // The last reduce has read its buffer before the CTA's shared memory goes away.
  if (!Tr::kDqWriter && ct % 128 == 0) bulk_wait_group_read<0>();

  // dV and dK (scaled) of this thread's two keys, stores of two adjacent columns: 4 bytes in T, or 8
  // in float32 (dkv_f32: a partial the caller sums, e.g. one block of the context-parallel ring, where
  // rounding every partial to 16 bits would add one rounding per block to the sum).
  const int64_t dv_base = int64_t{cta.batch} * p.dv_batch + int64_t{cta.head_kv} * p.dv_head;
  const int64_t dk_base = int64_t{cta.batch} * p.dk_batch + int64_t{cta.head_kv} * p.dk_head;
#pragma unroll
  for (int i = 0; i < Tr::kAccRegs; i += 2) {
    const int key = key0 + 8 * ((i / 2) % 2);
    const int col = 8 * (i / 4) + 2 * t;
    if (key < p.seqlen_k) {
      const int64_t ov = dv_base + int64_t{key} * p.dv_seq + col, ok = dk_base + int64_t{key} * p.dk_seq + col;
      if (p.dkv_f32) {
        *reinterpret_cast<float2*>(static_cast<float*>(p.dv) + ov) = make_float2(dv[i], dv[i + 1]);
        *reinterpret_cast<float2*>(static_cast<float*>(p.dk) + ok) = make_float2(dk[i] * p.scale, dk[i + 1] * p.scale);
      } else {
        *reinterpret_cast<uint32_t*>(static_cast<T*>(p.dv) + ov) = pack2<T>(dv[i], dv[i + 1]);
        *reinterpret_cast<uint32_t*>(static_cast<T*>(p.dk) + ok) = pack2<T>(dk[i] * p.scale, dk[i + 1] * p.scale);
      }
    }
  }
}

}  // namespace flash_fwd_sm90
}  // namespace tiled_attn
