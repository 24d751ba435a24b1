// flash_fwd_sm90_emulator.cpp: runs csrc/attention/sm90/flash_fwd_sm90_kernel.cuh (the wgmma attention
// forward, cp.async) and flash_fwd_sm90_ws_kernel.cuh (warp-specialized, TMA) on the CPU, unchanged,
// with every instruction they use that a host compiler cannot run emulated from the PTX ISA's
// description, independently of the kernels' own index arithmetic: wgmma (descriptors, swizzled
// canonical layouts, register fragments, fence / commit / wait semantics, in-flight operand checks),
// mbarrier, TMA, setmaxnreg and the async-proxy rules are sm90_emu.h's (shared with the backward's
// emulator, flash_bwd_sm90_emulator.cpp); cp.async, st.shared / ld.shared, shfl.xor, bar.sync
// (__syncthreads) with the race checks of flash_fwd_emulator.cpp (a read of data another warp wrote,
// or a write over data another warp read, with no barrier in between), the fibers and the case checks
// are emu_common.h's.
// The dynamic shared memory window starts at a random 16-byte-aligned address (not 1024-aligned), so
// a kernel that relies on the allocation's alignment for its 128-byte swizzle atoms fails here.
// Each CUDA thread is a ucontext fiber; a collective waits for its warp's (warpgroup's) threads, then
// computes every thread's result at once. Per case: output and lse against a float64 reference on
// the same rounded inputs (rows with no visible key: exactly 0 and -inf), no write outside out / lse.
//
// Build and run (CPU only; tests/test_cuda_attention_sm90.py does this):
//   g++ -std=c++17 -O1 -Wno-attributes -I<cuda>/include -Icsrc -DTILED_ATTN_EMULATION
//       tests/emulation/flash_fwd_sm90_emulator.cpp -o /tmp/flash_fwd_sm90_emulator && /tmp/flash_fwd_sm90_emulator
// Optional arguments: a head dim (0: all; 96 and 192 run the ws kernels only), a seed (inputs, thread
// schedule, shared-memory base, which warpgroup lags: emu_common.h g_lag_lo; the persistent grid's CTA
// count and sections), "cp.async", "ws", "ws_split", "ws_other", "ws_dynamic" or "ws_alt" (one kernel;
// ws_split: the ws tile with K and V released apart, WsTraits::kSplitRelease; ws_other: the ws tile on
// the other grid, WsTraits::kPersistent flipped; ws_dynamic: on the persistent grid fed by a tile
// counter, WsTraits::kDynamic; ws_alt: the consumers' ping-pong, the wide epilogue stores and the
// local schedule flipped, WsTraits::kPingPong, kWideStore, kLocalOrder). Each keeps the entry's other
// choices. Environment, for the
// emulator's own test: TILED_ATTN_EMU_LAG=W (warpgroup W lags in every case), TILED_ATTN_EMU_MUTATE=
// short_count (barriers counting several warpgroups count one fewer: a bug the emulator must catch).
#define EMU_KERNEL_NAMESPACE flash_fwd_sm90
#include "emu_common.h"
#include "sm90_emu.h"

#include "attention/sm90/flash_fwd_sm90_launch.cuh"

namespace tiled_attn {
namespace flash_fwd_sm90 {
template <class Tr, typename T>
cudaError_t launch_kernel(Params params, int batch_heads, cudaStream_t) {
  const unsigned m_blocks = static_cast<unsigned>((params.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM);
  return emu::launch_grid<Tr>(params, batch_heads, kMaxGridY, m_blocks, 1,
                              [](const Params& p) { flash_fwd_sm90_kernel<Tr, T>(p); });
}
// The warp-specialized kernel of the entry's tile, or (g_ws_split) the same tile with K and V released
// apart (WsTraits::kSplitRelease, the sweep's kWsSplit rows), or (g_ws_other) on the other grid
// (WsTraits::kPersistent flipped: one CTA per query tile where the tile is persistent, and the other
// way round): the TMA maps' boxes are the same. The persistent grid has g_sms CTAs (at most one per
// tile) and its sections come from an L2 of g_l2 bytes: both drawn per case, so CTAs walk one to all
// of the tiles and sections hold one to all pairs. (g_ws_alt) the ping-pong, wide stores and local
// order flipped.
bool g_ws_split = false, g_ws_other = false, g_ws_dynamic = false, g_ws_alt = false;
int g_sms = 1;
int64_t g_l2 = 0;
template <class Tr, typename T>
cudaError_t launch_ws_kernel(Params params, const TmaMaps& maps, int batch_heads, cudaStream_t) {
  const unsigned m_blocks = static_cast<unsigned>((params.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM);
  auto run = [&](auto traits) {
    using R = decltype(traits);
    if constexpr (R::kPersistent) {
      WsSchedule sched = ws_schedule_of<R>(params, m_blocks, batch_heads, g_l2);
      if (sched.tiles == 0) return cudaSuccess;
      params.bh_offset = 0;
      const unsigned grid = static_cast<unsigned>(std::min<int64_t>(sched.tiles, g_sms));
      // kDynamic: the counter zeroed and the picks poisoned, as the launcher's fresh allocation leaves
      // them.
      std::vector<int> counter(1 + grid, 0x7f7f7f7f);
      counter[0] = 0;
      if constexpr (R::kDynamic) sched.counter = counter.data();
      return emu::launch_grid<R>(params, 1, 1, grid, 1,
                                 [&](const Params& p) { flash_fwd_sm90_ws_kernel<R, T>(p, maps, sched); });
    } else {
      return emu::launch_grid<R>(params, batch_heads, kMaxGridY, m_blocks, 1,
                                 [&](const Params& p) { flash_fwd_sm90_ws_kernel<R, T>(p, maps, WsSchedule{}); });
    }
  };
  constexpr int kD = Tr::kHeadDim, kN = Tr::kBlockN, kC = Tr::kConsumers;
  constexpr bool kSplit = Tr::kSplitRelease, kPersistent = Tr::kPersistent, kPP = Tr::kPingPong;
  constexpr bool kWide = Tr::kWideStore, kLocal = Tr::kLocalOrder;
  static_assert(!Tr::kDynamic, "the library's entries run no counter-fed grid");
  if (g_ws_other) return run(WsTraits<kD, kN, kC, kSplit, !kPersistent, false, kPP, kWide, kLocal>{});
  if (g_ws_dynamic) return run(WsTraits<kD, kN, kC, kSplit, true, true, kPP, kWide, kLocal>{});
  if (g_ws_alt) return run(WsTraits<kD, kN, kC, kSplit, kPersistent, false, !kPP, !kWide, !kLocal>{});
  return g_ws_split ? run(WsTraits<kD, kN, kC, true, kPersistent, false, kPP, kWide, kLocal>{}) : run(Tr{});
}
}  // namespace flash_fwd_sm90
}  // namespace tiled_attn

#include "attention/sm90/flash_fwd_sm90.cu"

// ------------------------------------------------------------------------------------------------
// Cases
// ------------------------------------------------------------------------------------------------
namespace {

using emu_cases::Case;

// The run of a case: attention_fwd_sm90 (ws: attention_fwd_sm90_ws, the warp-specialized kernel) with
// the dynamic shared memory at a random base.
emu_cases::CaseRun case_run(const Case& c, bool ws, bool split = false, bool other = false, bool dynamic = false,
                            bool alt = false) {
  emu_cases::CaseRun run;
  run.entry = ws ? "attention_fwd_sm90_ws" : "attention_fwd_sm90";
  run.tag = alt ? "ws_alt" : dynamic ? "ws_dynamic" : other ? "ws_other" : split ? "ws_split" : ws ? "ws" : "cp.async";
  run.unwritten = "unwritten, or an accumulator read before its wgmma's wait";
  // The dynamic shared memory's address this case: 16-byte aligned, not 1024-aligned (but 0 sometimes).
  // One warpgroup in two cases lags the others (emu_common.h g_lag_lo): the producer or a consumer
  // (TILED_ATTN_EMU_LAG=W: warpgroup W in every case, -1 none).
  run.prepare = [split, other, dynamic, alt](std::mt19937& rng) {
    tiled_attn::flash_fwd_sm90::g_ws_split = split;
    tiled_attn::flash_fwd_sm90::g_ws_other = other;
    tiled_attn::flash_fwd_sm90::g_ws_dynamic = dynamic;
    tiled_attn::flash_fwd_sm90::g_ws_alt = alt;
    tiled_attn::flash_fwd_sm90::g_sms = std::uniform_int_distribution<int>(1, 4)(rng);
    const int64_t l2s[3] = {0, int64_t{1} << 20, int64_t{1} << 30};  // sections of one, a few, all pairs
    tiled_attn::flash_fwd_sm90::g_l2 = l2s[std::uniform_int_distribution<int>(0, 2)(rng)];
    emu::g_base = static_cast<uint32_t>(std::uniform_int_distribution<int>(0, 63)(rng)) * 16;
    int lag = std::uniform_int_distribution<int>(-4, 3)(rng);  // < 0: none
    if (const char* forced = std::getenv("TILED_ATTN_EMU_LAG")) lag = std::atoi(forced);  // the test's choice
    emu::g_lag_lo = lag < 0 ? 0 : 128 * lag;
    emu::g_lag_hi = lag < 0 ? 0 : 128 * lag + 128;
    char s[96];
    std::snprintf(s, sizeof s, "smem_base=%4u lag=%s sms=%d l2=%lld", emu::g_base,
                  lag < 0 ? "none" : std::to_string(lag).c_str(), tiled_attn::flash_fwd_sm90::g_sms,
                  static_cast<long long>(tiled_attn::flash_fwd_sm90::g_l2));
    return std::string(s);
  };
  run.launch = [&c, ws](tiled_attn::AttnDtype dtype, const void* q, const void* k, const void* v, void* out,
                        float* lse, tiled_attn::AttnStrides qs, tiled_attn::AttnStrides ks, tiled_attn::AttnStrides os,
                        float scale) {
    const auto entry = ws ? tiled_attn::attention_fwd_sm90_ws : tiled_attn::attention_fwd_sm90;
    return entry(dtype, q, k, v, out, lse, c.b, c.hq, c.hkv, c.nq, c.nk, c.d, qs, ks, ks, os, scale, c.causal, c.offset,
                 nullptr);
  };
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  const emu_cases::Args args = emu_cases::parse_args(argc, argv);
  const int only_d = args.only_d;
  std::mt19937 rng(args.seed);
  int failed = 0, ran = 0;
  try {
    emu::check_layout_tables();
  } catch (const std::exception& e) {
    std::printf("FAIL %s\n", e.what());
    return 1;
  }
  std::vector<Case> cases;
  for (int d : {64, 96, 128, 192, 256}) {
    if (only_d && d != only_d) continue;
    const bool bf = d == 128 || d == 96;  // alternate the dtype across head dims and cases
    cases.push_back({1, 1, 1, 128, 128, d, false, 0, !bf});          // one full tile each way
    cases.push_back({1, 1, 1, 1, 1, d, false, 0, bf});                // one query, one key
    cases.push_back({1, 2, 1, 3, 799, d, false, 0, !bf});             // many key tiles, ragged, GQA 2
    cases.push_back({1, 2, 1, 113, 203, d, true, 203 - 113, bf});     // bottom-right causal, GQA 2
    cases.push_back({2, 2, 2, 128, 217, d, false, 0, bf});            // ragged keys, two batches
    cases.push_back({1, 2, 1, 128, 217, d, true, 217 - 128, !bf});
    cases.push_back({1, 1, 1, 200, 256, d, true, 256 - 200, bf});     // two query tiles, diagonal inside
    cases.push_back({1, 2, 2, 200, 256, d, false, 0, !bf});
    cases.push_back({1, 2, 1, 150, 70, d, true, 70 - 150, !bf});      // Nq > Nk: rows with no key
    cases.push_back({1, 1, 1, 64, 128, d, false, 0, bf, -0.3});       // negative scale
    cases.push_back({1, 2, 1, 5, 0, d, false, 0, !bf});               // no keys at all
    cases.push_back({1, 1, 1, 400, 352, d, false, 0, bf});            // whole 176-key tiles, three 192-row tiles
    if (d != 256) cases.push_back({1, 3, 1, 200, 200, d, true, 0, bf});  // top-left causal, MQA
    if (d == 192) cases.push_back({1, 2, 1, 70, 2100, d, true, 2100 - 70, !bf});  // the long key tile (ws_long_keys)
  }
  // Optional third argument: "ws", "ws_split", "ws_other", "ws_dynamic", "ws_alt" or "cp.async" runs
  // that kernel only (default: all six).
  const std::string only = argc > 3 ? argv[3] : "";
  for (const Case& c : cases) {
    for (const char* kernel : {"cp.async", "ws", "ws_split", "ws_other", "ws_dynamic", "ws_alt"}) {
      if (!only.empty() && only != kernel) continue;
      const std::string k = kernel;
      // The cp.async kernel has fewer head dims than the warp-specialized one (flash_fwd_sm90.cu).
      if (k == "cp.async" && !tiled_attn::Sm90HeadDims::contains(c.d)) continue;
      emu_cases::run_counted(c, rng,
                             case_run(c, k != "cp.async", k == "ws_split", k == "ws_other", k == "ws_dynamic", k == "ws_alt"),
                             failed, ran);
    }
  }
  std::printf("%d of %d cases failed\n", failed, ran);
  return failed ? 1 : 0;
}
