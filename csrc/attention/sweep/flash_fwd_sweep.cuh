// flash_fwd_sweep.cuh: the kernel configurations benchmarks/sweep_cuda_attention.py times on the GPU
// against each other and against torch's FlashAttention-2, one row each: head dim, Cfg (tile shape,
// warps, stages, flags: flash_fwd.cuh), and what the row is expected to gain and why (the
// prediction the measurement then confirms or refutes). bf16 only in the sweep build; the CPU
// emulator (tests/emulation/flash_fwd_emulator.cpp) runs every row in both dtypes, and
// .ci/compile_csrc.sh compiles every row (no spills allowed).
//
// To adopt a row as a default: copy its Cfg into TileConfig<D> (or TileConfig<D, true> for causal
// launches) in flash_fwd.cuh and the same fields into configs.CUDA_ATTENTION.
#pragma once

#include <type_traits>

#include "../flash_fwd.cuh"
#include "../sm90/flash_fwd_sm90_ws_traits.cuh"

namespace tiled_attn {
namespace flash_fwd {

struct SweepVariant {
  int head_dim, block_m, block_n, warps, stages;
  unsigned flags;
  int min_blocks;
  const char* why;
};

namespace sweep_flags {
using namespace flag;
constexpr unsigned kFL = kFold | kLean;  // the two instruction-count cuts, on together in most rows
// The row is the sm90 warp-specialized kernel (sm90/flash_fwd_sm90_ws_kernel.cuh), not this file's:
// block_m = 64 x its consumer warpgroups, block_n its key tile; warps (the producer warpgroup
// included) and stages are what WsTraits derives, listed for the report. Built on sm_90 only. Adopt
// a pick in ws_consumers / ws_block_n (that header), by hand.
constexpr unsigned kWs = 1u << 16;
// With kWs: K and V slots released apart (WsTraits::kSplitRelease).
constexpr unsigned kWsSplit = 1u << 17;
// With kWs: one CTA per query tile instead of the persistent grid (WsTraits::kPersistent off).
constexpr unsigned kWsSingle = 1u << 18;
// With kWs (not kWsSingle): the persistent grid fed by a tile counter (WsTraits::kDynamic).
constexpr unsigned kWsDynamic = 1u << 19;
// With kWs: the consumers' ping-pong (WsTraits::kPingPong). Rows without it run without it, whatever
// ws_ping_pong says for their head dim (the rows above, measured before it, stay what they were).
constexpr unsigned kWsPingPong = 1u << 20;
// With kWs: the persistent epilogue's 16-byte stores (WsTraits::kWideStore); its schedule in sections of
// one KV head's pairs (WsTraits::kLocalOrder). Rows without them run without them.
constexpr unsigned kWsWide = 1u << 21;
constexpr unsigned kWsLocal = 1u << 22;
}  // namespace sweep_flags

// One row per line, each starting with `{<head dim>,` (benchmarks/sweep_cuda_attention.py counts
// them to know how many objects to build before the library that reports kNumSweep exists).
// clang-format off
constexpr SweepVariant kSweep[] = {
#define F sweep_flags::
    // ---- D = 64 (ours 0.93-0.95x FA2 before the sweep; 255 registers: 2 CTAs/SM) ----
    {64, 128, 64, 4, 2, F kQRegs, 1, "reference: the default before the sweep"},
    {64, 128, 64, 4, 2, F kQRegs | F kFold, 1, "+1-2%: one FMUL per score fewer (64 of ~800 instructions per tile)"},
    {64, 128, 64, 4, 2, F kQRegs | F kFL, 1, "+4-7%: and ~60 integer address instructions fewer per tile (~15% of the loop's instructions with the FMULs), most between a barrier and the first mma"},
    {64, 128, 64, 4, 2, F kQRegs | F kFL | F kLazy, 1, "+1-3% over kFL at N >= 2048: the accumulator rescale (64 FMUL/tile) skipped once the row max settles"},
    {64, 128, 64, 4, 3, F kQRegs | F kFL | F kJoint, 1, "+0-3% over kFL: one barrier per tile instead of two, two tiles in flight"},
    {64, 128, 32, 4, 3, F kFL | F kJoint, 3, "3 CTAs/SM (164 registers; 12 warps instead of 8) against twice the per-key tile overhead and Q re-read from smem: +/-5%"},
    {64, 256, 64, 8, 2, F kQRegs | F kFL | F kSkew, 1, "+5-15% if phase-aligned warp pairs idle the tensor pipe today: one group's softmax under the other's mma"},
    {64, 256, 64, 8, 3, F kQRegs | F kFL | F kSkew | F kLazy, 1, "kSkew with two tiles in flight and the lazy rescale"},
    // ---- D = 128 (ours 0.96-0.97x FA2; 255 registers: 2 CTAs/SM) ----
    {128, 128, 64, 4, 2, 0, 1, "reference: the default before the sweep"},
    {128, 128, 64, 4, 2, F kFold, 1, "+1-2%: one FMUL per score fewer (64 of ~1130 instructions per tile)"},
    {128, 128, 64, 4, 2, F kFL, 1, "+4-6%: and ~100 integer address instructions fewer per tile (~90 -> 42 per K or V tile; -14% instructions with the FMULs)"},
    {128, 128, 64, 4, 2, F kFL | F kLazy, 1, "+1-3% over kFL at N >= 2048: 128 FMUL/tile skipped once the row max settles"},
    {128, 128, 64, 4, 2, F kFL | F kJoint, 1, "+0-3% over kFL: one barrier per tile, one tile in flight (FA2 leaves ~1.5 tiles of latency slack)"},
    {128, 128, 64, 4, 2, F kFL | F kJoint | F kLazy, 1, "kJoint and kLazy together (FA2's own 1-stage schedule spills 4-24 B here)"},
    {128, 256, 32, 8, 2, F kFL | F kSkew, 1, "+5-15%: ping-pong of warp pairs (kBlockN = 64 spills 8 B under kSkew); 1 CTA/SM of 8 warps, half the L2->smem traffic per flop"},
    {128, 256, 32, 8, 3, F kFL | F kSkew | F kLazy, 1, "kSkew with two tiles in flight and the lazy rescale"},
    // ---- D = 256 (ours 0.91-0.98x FA2; 16 rows per warp: bound by shared-memory bandwidth) ----
    {256, 64, 64, 4, 1, 0, 1, "reference: the default before the sweep (FA2's H100 row)"},
    {256, 64, 64, 4, 1, F kFL, 1, "+5-10%: the copy address math is largest here (16 rows per thread per K or V tile: ~400 -> ~120 integer instructions per tile of ~1400); capped by the smem bandwidth bound (~10% above today)"},
    {256, 64, 64, 4, 1, F kFL | F kLazy, 1, "+1-3% over kFL at N >= 2048: 128 FMUL/tile skipped once the row max settles"},
    {256, 64, 32, 4, 2, F kQRegs | F kFL | F kJoint, 1, "+5-10%: Q in registers cuts smem reads by ~11% (16 of 144 ldmatrix per warp-tile); 2 CTAs/SM"},
    {256, 64, 32, 4, 2, F kFL | F kJoint, 1, "kJoint at 64x32 without Q in registers (isolates the Q-register gain)"},
    {256, 128, 64, 8, 1, F kFL, 1, "FA2's A100 row: 1 CTA/SM of 8 warps, half the cp.async smem writes per flop: +/-5%"},
    {256, 128, 32, 8, 2, F kFL | F kSkew, 1, "ping-pong at D = 256: 1 CTA/SM, 8 warps of 16 rows"},
    // ---- sm90 warp-specialized kernel (kWs; H200 2026-11-26 before the sweep, vs cuDNN: D = 64 0.63-0.96x,
    //      D = 128 0.72-1.12x, D = 256 0.69-0.89x). Only tiles whose consumers compile without spills
    //      (nvcc 13.0: D = 128 x 176 and D = 256 x 80, FA3's, spill 48 and 8 bytes at 240 registers).
    {64, 128, 128, 12, 4, F kWs, 1, "reference: the D = 64 tile before the sweep (two consumers)"},
    {64, 192, 112, 16, 4, F kWs, 1, "+5-10%: three consumers (FA3's 192-row tile) keep two wgmma streams busy while the third runs its softmax; 112 keys is the longest tile at 160 registers without spills"},
    {64, 192, 96, 16, 4, F kWs, 1, "192 x 96: more tiles (and barrier waits) per row than x 112, 8 registers spare: -2-0%"},
    {128, 128, 128, 12, 3, F kWs, 1, "reference: the D = 128 tile before the sweep"},
    {128, 128, 144, 12, 2, F kWs, 1, "+2-4% non-causal: 12% fewer key tiles (softmax rounds, waits), two slots instead of three"},
    {128, 128, 160, 12, 2, F kWs, 1, "+3-6% non-causal (FA3 picks 176): 20% fewer key tiles; the causal diagonal wastes more: -2-0% causal"},
    {256, 128, 64, 12, 2, F kWs, 1, "reference: the D = 256 tile (the only one without spills here)"},
    // K and V released apart (kWsSplit: FA3's order): the P V in flight holds only V's slot, so two slots keep
    // a K tile of lead.
    {128, 128, 128, 12, 3, F kWs | F kWsSplit, 1, "against the reference: the release split alone (+0-2%: three slots already keep the producer ahead)"},
    {128, 128, 144, 12, 2, F kWs | F kWsSplit, 1, "144 keys with two slots, K freed before the softmax: the 30% loss of the unsplit 144 gone if the lead was what it lacked"},
    {128, 128, 160, 12, 2, F kWs | F kWsSplit, 1, "160 keys, split: FA3's shape class (its 176 spills here); +3-6% over the reference if the lead suffices"},
    {256, 128, 64, 12, 2, F kWs | F kWsSplit, 1, "D = 256, split: its two slots are the same limit (0.67-0.83x cuDNN on the H200)"},
    // D = 96 and 192 (session 27, 2026-11-29: new in the kWs kernel; the default there is the Triton forward in two
    // head-dim parts, 0.66-0.84x and 0.55-0.63x cuDNN on the H100 in session 19). D = 96 runs on 128-column
    // shared tiles (WsTraits::kTileD: TMA zero-fills past D), so its P V does 4/3 the useful work.
    {96, 128, 128, 12, 3, F kWs, 1, "reference: D = 128's tile; predicted ~0.86x D = 128's TFLOP/s (Q K^T 6 k steps of 8, P V all 8)"},
    {96, 128, 128, 12, 3, F kWs | F kWsSplit, 1, "the release split at D = 96 (as at D = 128: +0-2%)"},
    {96, 128, 160, 12, 2, F kWs | F kWsSplit, 1, "160 keys, two slots, split: 20% fewer key tiles if the K lead suffices"},
    {96, 192, 64, 16, 4, F kWs, 1, "three consumers (FA3's 192-row tile at D = 96, with 64 keys here: 160 registers hold S 32 + P 16 + O 64)"},
    {192, 128, 64, 12, 3, F kWs, 1, "reference: D = 256's tile shape at D = 192, three slots"},
    {192, 128, 64, 12, 3, F kWs | F kWsSplit, 1, "the release split with three slots (+0-2%)"},
    {192, 128, 96, 12, 2, F kWs, 1, "96 keys, two slots: a third fewer key tiles, no K lead (the D = 128 x 144 two-slot tile lost 30%)"},
    {192, 128, 96, 12, 2, F kWs | F kWsSplit, 1, "96 keys, two slots, split: K freed before the softmax keeps a K tile of lead"},
    {192, 128, 112, 12, 2, F kWs | F kWsSplit, 1, "FA3's D = 192 tile (128 x 112), split"},
    // Session 27's first run (H200): the split +34-65% at D = 256 (two slots), +-3% at D = 96 / 192 with three.
    {64, 192, 112, 16, 4, F kWs | F kWsSplit, 1, "D = 64's tile, split (four slots: +-2% expected)"},
    // Session 28: the persistent grid (WsTraits::kPersistent, every kWs row above since) against one CTA per query
    // tile, each default tile (D = 192: both of its tiles).
    {64, 192, 112, 16, 4, F kWs | F kWsSingle, 1, "D = 64's tile, one CTA per tile: the persistent grid predicted +10-25% at N = 512, +0-5% at N >= 8192"},
    {96, 128, 128, 12, 3, F kWs | F kWsSingle, 1, "D = 96's tile, one CTA per tile"},
    {128, 128, 128, 12, 3, F kWs | F kWsSingle, 1, "D = 128's tile, one CTA per tile"},
    {192, 128, 64, 12, 3, F kWs | F kWsSplit | F kWsSingle, 1, "D = 192's short-key tile, one CTA per tile"},
    {192, 128, 112, 12, 2, F kWs | F kWsSplit | F kWsSingle, 1, "D = 192's long-key tile (ws_long_block_n), one CTA per tile"},
    {256, 128, 64, 12, 2, F kWs | F kWsSplit | F kWsSingle, 1, "D = 256's tile, one CTA per tile"},
    // The counter-fed persistent grid (kWsDynamic) against the tiles dealt in turn, for causal launches (where dealing
    // in turn unbalances the sawtooth: benchmarks/model_ws_schedule.py) and full ones (no change expected).
    {128, 128, 128, 12, 3, F kWs | F kWsDynamic, 1, "D = 128 fed by a counter: causal N >= 2048 +3-20% over the tiles dealt in turn (the model: 1.03-1.49x makespan), full +-2%"},
    {192, 128, 112, 12, 2, F kWs | F kWsSplit | F kWsDynamic, 1, "D = 192's long tile fed by a counter: causal 16k ~+20% over dealing in turn (the model: 1.23x -> 1.00x)"},
    // Session 29: the consumers' ping-pong (kWsPingPong) against the same tiles without it (rows 24, 34, 26, 44,
    // 46, 42, 47, 49): the tensor pipe busy during the other consumer's softmax (ncu at D = 128 N = 512: 47%
    // against cuDNN's 61%; FA3's ablation +10-15% at D = 128). Measured: no gain on the persistent grid, up to
    // -10% (ws_ping_pong has the figures; results/sweeps/2026-11-29-h200-s29-ws-ping-pong.md).
    {64, 192, 112, 16, 4, F kWs | F kWsPingPong, 1, "D = 64's tile, ping-pong of three consumers: +5-15% (softmax is the largest share of a tile at D = 64)"},
    {96, 128, 128, 12, 3, F kWs | F kWsPingPong, 1, "D = 96's tile, ping-pong: +5-15%"},
    {128, 128, 128, 12, 3, F kWs | F kWsPingPong, 1, "D = 128's tile, ping-pong: +5-15% (FA3: +10-15%)"},
    {64, 192, 112, 16, 4, F kWs | F kWsSingle | F kWsPingPong, 1, "D = 64, one CTA per tile (long causal launches), ping-pong"},
    {128, 128, 128, 12, 3, F kWs | F kWsSingle | F kWsPingPong, 1, "D = 128, one CTA per tile (long causal launches), ping-pong"},
    {192, 128, 112, 12, 2, F kWs | F kWsSplit | F kWsPingPong, 1, "D = 192's long tile, ping-pong (FA3 does not: P V is the larger share there): +-5%"},
    {192, 128, 64, 12, 3, F kWs | F kWsSplit | F kWsSingle | F kWsPingPong, 1, "D = 192's short tile, ping-pong: +-5%"},
    {256, 128, 64, 12, 2, F kWs | F kWsSplit | F kWsSingle | F kWsPingPong, 1, "D = 256, ping-pong: +-5%"},
    // Session 29, the persistent grid's memory traffic (ncu at D = 128 N = 512, B·H = 1024: DRAM 735 MB against
    // cuDNN's 525, the least possible, and 1.5x its L2 throughput): the epilogue's 16-byte stores of whole sectors
    // (kWsWide) and the schedule of one pair's query tiles on neighbouring CTAs (kWsLocal), against rows 24, 34,
    // 26, 42 and 33 (D = 256 persistent: 5-11% behind one CTA per tile, the epilogue the suspect). Measured: the
    // 16-byte stores +4-17% at N <= 1024 and 2-9% slower from 2048 (taken there: ws_short_block_n), the local
    // order up to 30% slower causal (not taken: WsTraits::kLocalOrder); rows 70 / 71 the stores alone.
    {64, 192, 112, 16, 4, F kWs | F kWsLocal, 1, "D = 64, local order: +0-10% at N <= 2048 if K / V refetched from DRAM cost that"},
    {64, 192, 112, 16, 4, F kWs | F kWsWide, 1, "D = 64, 16-byte stores: +0-3% (the epilogue is 1/Nk-tiles of a tile)"},
    {64, 192, 112, 16, 4, F kWs | F kWsWide | F kWsLocal, 1, "D = 64, both"},
    {96, 128, 128, 12, 3, F kWs | F kWsWide | F kWsLocal, 1, "D = 96, both"},
    {128, 128, 128, 12, 3, F kWs | F kWsLocal, 1, "D = 128, local order: +0-10% at N <= 2048"},
    {128, 128, 128, 12, 3, F kWs | F kWsWide, 1, "D = 128, 16-byte stores: +0-3%"},
    {128, 128, 128, 12, 3, F kWs | F kWsWide | F kWsLocal, 1, "D = 128, both"},
    {192, 128, 112, 12, 2, F kWs | F kWsSplit | F kWsWide | F kWsLocal, 1, "D = 192's long tile, both"},
    {256, 128, 64, 12, 2, F kWs | F kWsSplit | F kWsWide, 1, "D = 256 persistent, 16-byte stores: closes the 5-11% to one CTA per tile if the epilogue is it"},
    {256, 128, 64, 12, 2, F kWs | F kWsSplit | F kWsWide | F kWsLocal, 1, "D = 256 persistent, both"},
    {96, 128, 128, 12, 3, F kWs | F kWsWide, 1, "D = 96, 16-byte stores alone"},
    {192, 128, 112, 12, 2, F kWs | F kWsSplit | F kWsWide, 1, "D = 192's long tile, 16-byte stores alone"},
    // Session 29, cuDNN's L2 traffic (ncu at D = 128 N = 512: it reads 0.82 GB from L2 where we read 1.21, about
    // 2.7 passes over each head's K and V to our 4, as 192-row query tiles make): three consumers at D = 128, 64 keys
    // (160 registers: S 32 + P 16 + O 64), against rows 65 / 26; D = 96 likewise. Measured (H200, results/sweeps/
    // 2026-11-29-h200-s29-ws-three-consumers-d96-d128.md): D = 128 12-25% slower than 128 x 128 at every N (causal
    // too), D = 96 9-17%: the doubled key tiles (softmax rounds, waits) cost more than the L2 reads saved.
    {128, 192, 64, 16, 4, F kWs | F kWsWide, 1, "D = 128, 192 x 64, 16-byte stores: a third less K / V read from L2 at N <= 1024, twice the key tiles"},
    {128, 192, 64, 16, 4, F kWs, 1, "D = 128, 192 x 64 (for N >= 2048)"},
    {96, 192, 64, 16, 4, F kWs | F kWsWide, 1, "D = 96, 192 x 64, 16-byte stores (row 37 with them), against rows 70 / 34"},
#undef F
};
// clang-format on
constexpr int kNumSweep = sizeof(kSweep) / sizeof(kSweep[0]);

template <int I>
using SweepCfg =
    Cfg<kSweep[I].block_m, kSweep[I].block_n, kSweep[I].warps, kSweep[I].stages, kSweep[I].flags, kSweep[I].min_blocks>;
template <int I>
constexpr bool kSweepWs = (kSweep[I].flags & sweep_flags::kWs) != 0;
// (std::conditional_t only names the other branch's type: nothing of it is instantiated.)
template <int I>
using SweepTraits = std::conditional_t<kSweepWs<I>,
                                       flash_fwd_sm90::WsTraits<kSweep[I].head_dim, kSweep[I].block_n, kSweep[I].block_m / 64,
                                                                (kSweep[I].flags & sweep_flags::kWsSplit) != 0,
                                                                (kSweep[I].flags & sweep_flags::kWsSingle) == 0,
                                                                (kSweep[I].flags & sweep_flags::kWsDynamic) != 0,
                                                                (kSweep[I].flags & sweep_flags::kWsPingPong) != 0,
                                                                (kSweep[I].flags & sweep_flags::kWsWide) != 0,
                                                                (kSweep[I].flags & sweep_flags::kWsLocal) != 0>,
                                       Traits<kSweep[I].head_dim, SweepCfg<I>>>;

// The registry of the sweep build: sweep/flash_fwd_sweep.cu registers each variant it instantiates
// (all of them, or the one the build names), sweep/flash_fwd_sweep_entry.cu looks them up.
using SweepFn = cudaError_t (*)(const Params&, int, cudaStream_t);
SweepFn* sweep_registry();  // kNumSweep entries, null until registered
inline bool register_sweep(int i, SweepFn fn) {
  sweep_registry()[i] = fn;
  return true;
}

}  // namespace flash_fwd
}  // namespace tiled_attn
