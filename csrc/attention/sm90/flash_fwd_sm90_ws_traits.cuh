// flash_fwd_sm90_ws_traits.cuh: the tile shapes of the warp-specialized wgmma attention forward
// (flash_fwd_sm90_ws_kernel.cuh), apart from its PTX so that the sweep's variant table
// (../sweep/flash_fwd_sweep.cuh) can name them in builds without sm_90a code (the CPU emulators).
#pragma once

#include <algorithm>

namespace tiled_attn {
namespace flash_fwd_sm90 {

// The tile per head dim (causal or not): consumer warpgroups (64 query rows each), keys per tile and the
// release order, chosen by benchmarks/sweep_cuda_attention.py --ws over the kWs rows of
// csrc/attention/sweep/flash_fwd_sweep.cuh (H200, kernel time, bf16, B·N = 32k tokens, H·D = 2048).
// Measured (benchmarks/results/sweeps/2026-11-26-h200-s16-sm90-ws-tiles.md, D = 64 / 128 / 256, and
// 2026-11-29-h200-s27-sm90-ws-tiles.md, D = 96 / 192 / 256 with the release split):
//   D = 64: three consumers, 192 x 112: +2-9% over two (128 x 128) at N >= 2048, -5-13% at N <= 1024
//     (where backend=None runs the Triton forward anyway: configs.ATTENTION_SELECT).
//   D = 128: 128 x 128 with three ring slots. 144 and 160 keys (FA3 picks 176) fit only two slots
//     and lose 30-37%: one slot is held by the P V in flight (the slot is freed after P V, so with
//     two slots the producer cannot run a tile ahead). With K and V freed apart (below) they still
//     lose 1-18%, and the split alone costs 0-5% (2026-11-29-h200-s27-sm90-ws-split-d64-d128.md; at
//     D = 64 4-11% at N >= 8192): both keep the unsplit tile.
//   D = 96: D = 128's tile (its shared tiles are 128 columns wide, below): 341-534 TFLOP/s, causal
//     217-525 (cuDNN 410-496, 273-440); the release split within +-3%, 160 keys (split) 0-19% slower,
//     three consumers x 64 keys 3-13% slower.
//   D = 192: 128 x 64, three slots, K and V released apart: 454-675, causal 298-674 (cuDNN 497-645,
//     342-590); the unsplit tile within -2/+3% of it; 96 and 112 keys (two slots) need the split (96 unsplit: -30%) and are
//     then +3-10% at N >= 2048 but -5-11% at N = 512 (112 keys, causal: -11%).
//   D = 256: 128 x 64, two slots (the same limit; 80 keys spill here), K and V released apart:
//     +34-65% over the unsplit tile (498-738 against 372-535; cuDNN 536-720).
template <int kHeadDim>
constexpr int ws_consumers() {
  return kHeadDim == 64 ? 3 : 2;
}
template <int kHeadDim>
constexpr int ws_block_n() {
  return kHeadDim == 64 ? 112 : kHeadDim <= 128 ? 128 : 64;
}
// A longer key tile from ws_long_keys keys on (0: none): D = 192's 112 keys (two slots, K and V
// released apart; FA3's tile) measured +3-10% over 64 at N >= 2048 and -5-11% at N = 512 (above);
// session 28, over the one-CTA 64-key tile at N >= 2048: +11-16% on the persistent grid (full
// launches), +6-12% one CTA per tile (causal ones, where the grid stays so: ws_persistent).
template <int kHeadDim>
constexpr int ws_long_block_n() {
  return kHeadDim == 192 ? 112 : 0;
}
template <int kHeadDim>
constexpr int ws_long_keys() {
  return 2048;
}
template <int kHeadDim>
constexpr bool ws_split_release() {
  return kHeadDim >= 192;
}

// Persistent (FA3's tile scheduler): one CTA per SM walks query tiles in turn instead of one CTA per
// tile. The producer loads the next tile's Q as soon as the consumers' last Q Kᵀ of a tile has landed
// and its first K / V slots as the ring frees them, so a tile's start (Q and K latency) and end (the
// last P V, the output stores) overlap its neighbours': what one CTA per tile, one per SM (their shared
// memory), leaves exposed, a large share of the time at N = 512-2048 where a CTA has 4-16 key tiles.
// Measured against one CTA per tile (H200, kernel time, sweep rows 44-49 against 24 / 34 / 26 / 39 /
// 42 / 33, benchmarks/results/sweeps/2026-11-29-h200-s28-ws-persistent.md):
//   D = 64 +8-22%, D = 96 +6-20%, D = 128 +2-20% (the most at N = 512, causal): on.
//   D = 192, 64 keys: -2-+1%; 112 keys (ws_long_block_n, N >= 2048): +3-4%: on for the 112-key
//     tile only (the one-CTA one, the tested path, kept where it makes no difference).
//   D = 256: 5-11% slower: off. Not profiled; the one difference that grows with D is the epilogue
//     (4-byte stores straight from the accumulators, 128 a thread at D = 256, where one CTA per tile
//     stages O in shared memory for 16-byte stores).
// Causal launches take it only up to ws_causal_persistent_m_blocks query tiles per head. The tiles are
// dealt to the CTAs in turn (a static schedule: tile i to CTA i mod grid), which balances tiles of
// equal length but not causal ones, the worse the longer their sawtooth: the attention suite's D = 192
// causal N = 16k point fell from 644 to 554 TFLOP/s on it, and benchmarks/model_ws_schedule.py (each
// tile its key tiles + 0.5) puts that launch's longest CTA at 1.23x the mean, where a global tile
// counter (FA3's dynamic scheduler; WsTraits::kDynamic, measured slower: see there) gives 1.00x.
// Against one CTA per tile (the hardware's dynamic dealing) the model's worst case over B·H =
// 1..1024 is 1.02-1.07x at up to 8 query tiles a head (N <= 1024 at 128 rows), where the persistent
// grid measured +14-22% (causal N = 512 and 1024); at N = 2048 up to 1.18x (D = 64) against +1-11%.
// (At the sweep's shapes, B·H = 32-128, D = 128 causal N = 2048-16384 measured +3-8% dealt in turn:
// the model's bad cases are small B·H; a rule from the model per launch is the next step.)
template <int kHeadDim>
constexpr bool ws_persistent() {
  return kHeadDim <= 128;
}
constexpr int ws_causal_persistent_m_blocks() { return 8; }

// The consumers' ping-pong (FA3 §3.1; WsTraits::kPingPong): a named barrier per consumer passes a
// token round them, and a consumer issues its Q Kᵀ and P V products only while it holds it, then
// hands it on. The tensor cores then run one consumer's products while the other runs its softmax,
// instead of all of them issuing at once and then all exponentiating with the tensor cores idle
// (ncu, H200, D = 128 N = 512: cuDNN 31% of its stalls at a CTA barrier, 61% tensor pipe; ours 47%).
// FA3 takes it at D <= 128. Measured here it does not pay (H200, kernel time, sweep rows 52-59 against
// the same tiles without it, benchmarks/results/sweeps/2026-11-29-h200-s29-ws-ping-pong.md). On the
// persistent grid: D = 128 -3% at N = 512 to -10% at 8192 (636 -> 571 TFLOP/s), causal -2 to -10%;
// D = 96 -1 to -8%; D = 64 -2 to +1%; D = 192 x 112 -5 to +2%. One CTA per tile: D = 128 +6% at
// N = 512 to -1% at 8192 (causal +3 to -3%), D = 64 +0-4%, D = 192 x 64 -1 to -6%, D = 256 -1 to -2%.
// Inside a consumer one tile's softmax already runs under the last one's P V (the intra-warpgroup
// overlap, below), so the order it imposes mostly delays the next issue. Off everywhere.
template <int kHeadDim>
constexpr bool ws_ping_pong() {
  return false;
}

// Short launches (Nk <= ws_short_keys): the persistent grid with the 16-byte epilogue stores
// (WsTraits::kWideStore: store_output trades the accumulators across each quad so that a store writes
// whole 32-byte sectors, not half of one) on a tile per head dim (ws_short_block_n; 0: none). Where a
// CTA has few key tiles the epilogue is a large share of its time and of the L2's write traffic (ncu,
// H200, D = 128 N = 512 B·H = 1024: 7.4 M sectors written in 6.6 M requests by the 4-byte stores,
// against cuDNN's 4.2 M in 1.0 M, the least O's 128 MB takes; 4.3 M in 1.5 M with the 16-byte ones,
// and the kernel 319 -> 288 us: benchmarks/results/ncu/2026-11-29-h200-s29-fwd-d128-n512-*).
// Measured against the same tiles with 4-byte stores (H200, kernel time, sweep rows 65 / 70 / 71 /
// 68, benchmarks/results/sweeps/2026-11-29-h200-s29-ws-wide-store-short.md): D = 96 +12% at N = 512,
// +4% at 1024, causal +9% / +4%; D = 128 +12% / +4%, causal +11% / +8%; D = 192 (112 keys) +17% /
// +8%, causal +17% / +15%, and +8% / +6% over the 64-key one-CTA tile the launcher took there;
// D = 256 +4-10% over its one-CTA tile. From N = 2048 the wide stores are 2% slower, from 4096 5-9%
// (the same key-tile loop, ordered differently by ptxas: ...-ws-wide-store-sass.md there), so
// longer launches keep the 4-byte stores. D = 64: -1-0% (rows 61 / 24), none.
template <int kHeadDim>
constexpr int ws_short_block_n() {
  return kHeadDim == 64 ? 0 : kHeadDim <= 128 ? 128 : kHeadDim == 192 ? 112 : 64;
}
constexpr int ws_short_keys() { return 1024; }

// The persistent schedule's sections of one (batch, KV head) group of pairs (WsTraits::kLocalOrder,
// sweep rows only): every query tile of a pair dealt to neighbouring CTAs, which stream its K and V
// together, in place of sections as large as half the L2 holds (a pair's K and V read again one pass
// of the section later; ncu at D = 128 N = 512: 621 MB read from DRAM against cuDNN's 403). Measured
// (H200, rows 60 / 64 against 24 / 26, sweeps/2026-11-29-h200-s29-ws-wide-store.md): full launches -1-0%
// (D = 128 N = 8192 -4%), causal up to -30%: with m_blocks dividing the grid, CTA c always gets the
// same query tile of each pair, so the longest causal tiles all fall to the same CTAs.

// kSplitRelease: K and V slots released apart (FA3's order). A consumer frees K_i as soon as S_i = Q K_iᵀ
// has landed (before its softmax) and V_i once P_i V_i has; the producer loads K_{i+1} before V_i. The
// slot held by the P V in flight is then only V's, so with two slots the producer still runs a K tile
// ahead: what the two-slot tiles lack (D = 256: +34-65%, above). The default per head dim:
// ws_split_release.
template <int kHeadDim_, int kBlockN_, int kConsumers_ = ws_consumers<kHeadDim_>(),
          bool kSplitRelease_ = ws_split_release<kHeadDim_>(), bool kPersistent_ = false, bool kDynamic_ = false,
          bool kPingPong_ = ws_ping_pong<kHeadDim_>(), bool kWideStore_ = false, bool kLocalOrder_ = false>
struct WsTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kConsumers = kConsumers_;
  static constexpr bool kSplitRelease = kSplitRelease_;
  static constexpr bool kPersistent = kPersistent_;
  // The persistent grid fed by a tile counter (WsSchedule::counter) instead of dealing tiles in turn.
  // Sweep rows only: correct (the sweep's checks, the emulator's ws_dynamic cases) but slower
  // (benchmarks/results/sweeps/2026-11-29-h200-s28-ws-dynamic.md, H200, kernel time): D = 128 -5-12%
  // against dealing in turn, causal too; D = 192 x 112 -9-10% full, and at causal 16k 646 TFLOP/s
  // against 586 dealt in turn but 735 one CTA per tile. Its budgets below (40 / 232 registers) are one
  // suspect: the 24-register producer spilled around the counter's atomic.
  static constexpr bool kDynamic = kDynamic_;
  static constexpr bool kPingPong = kPingPong_;  // ws_ping_pong
  static constexpr bool kWideStore = kWideStore_;  // ws_short_block_n
  static constexpr bool kLocalOrder = kLocalOrder_;  // sweep rows only (the comment above WsTraits)
  static constexpr int kThreads = (kConsumers + 1) * 128;
  static constexpr int kConsumerThreads = kConsumers * 128;
  static constexpr int kBlockM = 64 * kConsumers;
  // The shared tiles' width: the head dim in whole 128-byte swizzle rows (64 columns). A head dim that
  // is not a multiple of 64 (96) is padded: the TMA box past column D reads outside the map (whose
  // inner dimension is D), which the hardware fills with zeros, so nothing past D is read from memory.
  // Q Kᵀ stops at D (kQKSteps); P V runs over the whole width (wgmma's MN-major B operand with a
  // 128-byte swizzle spans whole 64-column blocks), the zero columns of V giving zero columns of O
  // that the epilogue does not store: at D = 96 the P V product does 4/3 the useful work.
  static constexpr int kTileD = (kHeadDim + 63) / 64 * 64;
  static constexpr int kSRegs = kBlockN / 2;
  static constexpr int kORegs = kTileD / 2;
  static constexpr int kQKSteps = kHeadDim / 16;
  static constexpr int kPVSteps = kBlockN / 16;
  static constexpr int kColBlocks = kTileD / 64;  // 128-byte (64-element) column blocks, one TMA box each
  static constexpr int kQBytes = kBlockM * kTileD * 2;
  static constexpr int kKVBytes = kBlockN * kTileD * 2;
  // Ring depth: as many K+V slots as fit beside Q under the 227 KB opt-in, at most 4 (D = 64: 4;
  // D = 96 and 128: 3 at 128 keys, 2 at 144-176; D = 192: 3 at 64 keys, 2 at 80-112; D = 256: 2).
  // Two slots stall the consumers unless K and V are released apart (see above). The + 1024: the
  // dynamic shared memory base is aligned up to the swizzle atom inside the kernel.
  static constexpr int kSmemLimit = 232448;
  static constexpr int kBarriersPerSlot = kSplitRelease ? 4 : 3;  // K full, V full, and one empty or K / V empty
  static constexpr int kStages =
      std::min(4, (kSmemLimit - 1024 - kQBytes - 8 * (2 + 4 * kBarriersPerSlot)) / (2 * kKVBytes));
  static constexpr int kBarriers = 2 + kBarriersPerSlot * kStages;  // + Q full, Q empty (persistent)
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKVBytes + 8 * kBarriers + 1024;
  // Register budgets after setmaxnreg (FA3's): the CTA's 64 K registers, which __launch_bounds__(kThreads,
  // 1) spreads evenly at launch (168 or 128 a thread), move to the consumers: 24 x 128 + 240 x 256 or
  // 32 x 128 + 160 x 384. What a consumer holds: S kBlockN / 2, P kBlockN / 4 and O kTileD / 2
  // registers, live together while one tile's softmax overlaps the last one's P V, and ~40 more.
  // kDynamic with two consumers: 40 x 128 + 232 x 256 (the counter's atomic spilled 28-84 bytes in a
  // 24-register producer; 232 still holds D = 128 and D = 192 x 112 without spills, nvcc 13.0).
  static constexpr int kProducerRegs = kConsumers == 2 ? (kDynamic ? 40 : 24) : 32;
  static constexpr int kConsumerRegs = kConsumers == 2 ? (kDynamic ? 232 : 240) : 160;

  static_assert(kHeadDim % 16 == 0, "whole k steps of Q Kᵀ and 16-byte output chunks");
  static_assert(kConsumers == 2 || kConsumers == 3, "the register budgets above");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "wgmma's N (Q Kᵀ) and whole k steps (P V); a TMA box of <= 256 rows");
  static_assert(kPersistent || !kDynamic, "the tile counter feeds the persistent grid");
  static_assert(kStages >= 2, "one slot loading while one is computed");
  static_assert(kSmemBytes <= kSmemLimit, "the sm90 opt-in shared memory limit");
  // setmaxnreg moves registers within the CTA's own allocation (launch: 64 K / kThreads, rounded down to
  // 8, a thread), so the budgets must fit in it, not merely in the register file.
  static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumerThreads <= 65536 / kThreads / 8 * 8 * kThreads,
                "the CTA's register allocation");
};

}  // namespace flash_fwd_sm90
}  // namespace tiled_attn
