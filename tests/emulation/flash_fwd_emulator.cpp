// flash_fwd_emulator.cpp: runs csrc/attention/flash_fwd_kernel.cuh on the CPU, unchanged, with every
// warp-level instruction it uses (ldmatrix, mma.sync, cp.async, shfl, __syncthreads) emulated from the
// PTX ISA's own tables, written here independently of the kernel's lane arithmetic. Each CUDA thread is
// a ucontext fiber; a warp collective waits for its 32 lanes, then computes every lane's result at once.
// (The fibers, cp.async, the hazard checks and the per-case reference are emu_common.h's, shared with
// flash_fwd_sm90_emulator.cpp; ldmatrix, mma.sync and the launches are here.)
// Checked per case against a float64 reference: output and lse (rows with no visible key: exactly 0 and
// -inf), no write outside out/lse's elements, and shared-memory hazards: a cp.async destination read
// before its wait_group, or read / overwritten by another warp with no __syncthreads in between.
// Split-KV cases (Case::splits > 0) run attention_fwd_split: the split kernel (flash_fwd_kernel<Tr, T,
// true>, its grid.z the key splits) and the merge kernel (attention_merge.cuh), with the workspace
// NaN-poisoned between guards: every partial must be written, nothing outside it.
//
// Build and run (CPU only; tests/test_cuda_attention_kernel.py does this):
//   g++ -std=c++17 -O1 -Wno-attributes -I<cuda>/include -Icsrc -DTILED_ATTN_EMULATION
//       tests/emulation/flash_fwd_emulator.cpp -o /tmp/flash_fwd_emulator && /tmp/flash_fwd_emulator
// Optional arguments: a head dim (0: all) to run only its cases, and a seed for the inputs and the
// thread schedule (default fixed; tests/test_cuda_attention_kernel.py passes a fresh one).
#define EMU_KERNEL_NAMESPACE flash_fwd
#include "emu_common.h"

namespace emu {

// The hooks of emu_common.h: the mma.sync kernel has no state beyond the common one.
void on_barrier() {}
void on_block_start(int) {}
void on_block_exit() {}
void on_round() {}
bool on_stall() { return false; }
void on_tma_byte(const ByteState&, const char*) { fail("emulator: a TMA byte in the mma.sync kernel"); }

bool any_sync(bool pred) {
  Collective& c = g_warps[cur_warp()];
  const int lane = cur_lane();
  c.in_u[lane][0] = pred;
  warp_collective("any", [&](Collective& cc) {
    uint32_t any = 0;
    for (int l = 0; l < 32; ++l) any |= cc.in_u[l][0];
    for (int l = 0; l < 32; ++l) cc.out_u[l][0] = any;
  });
  return c.out_u[lane][0] != 0;
}

uint16_t smem16(uint32_t addr) {
  uint16_t v;
  std::memcpy(&v, g_dyn + (addr - g_base), 2);
  return v;
}

// ldmatrix.m8n8.x4(.trans).b16 from the PTX ISA: lanes 8i..8i+7 give the row addresses of matrix i;
// without .trans lane l receives, in register i, matrix i's elements (row l/4, cols 2(l%4), 2(l%4)+1),
// with .trans (rows 2(l%4), 2(l%4)+1 of col l/4); the first element in the low 16 bits.
void ldmatrix(uint32_t (&r)[4], uint32_t addr, bool trans) {
  Collective& c = g_warps[cur_warp()];
  const int lane = cur_lane();
  if (addr % 16 != 0) fail("ldmatrix: row address not 16-byte aligned");
  for (int b = 0; b < 16; ++b) check_byte_read(addr + b, "ldmatrix");
  c.in_u[lane][0] = addr;
  warp_collective(trans ? "ldmatrix.trans" : "ldmatrix", [&](Collective& cc) {
    for (int l = 0; l < 32; ++l) {
      for (int i = 0; i < 4; ++i) {
        uint16_t lo, hi;
        if (!trans) {
          const uint32_t row = cc.in_u[8 * i + l / 4][0];
          lo = smem16(row + 2 * (2 * (l % 4)));
          hi = smem16(row + 2 * (2 * (l % 4) + 1));
        } else {
          lo = smem16(cc.in_u[8 * i + 2 * (l % 4)][0] + 2 * (l / 4));
          hi = smem16(cc.in_u[8 * i + 2 * (l % 4) + 1][0] + 2 * (l / 4));
        }
        cc.out_u[l][i] = lo | (uint32_t{hi} << 16);
      }
    }
  });
  for (int i = 0; i < 4; ++i) r[i] = c.out_u[lane][i];
}

// mma.m16n8k16.row.col, fragments from the PTX ISA (g = lane/4, t = lane%4):
//   A: a0,a1 (row g, k 2t,2t+1)  a2,a3 (row g+8, k 2t,2t+1)  a4,a5 (row g, k 2t+8,+9)  a6,a7 (row g+8, k 2t+8,+9)
//   B: b0,b1 (k 2t,2t+1, col g)  b2,b3 (k 2t+8,2t+9, col g)
//   C: c0,c1 (row g, col 2t,2t+1)  c2,c3 (row g+8, col 2t,2t+1)
template <typename T>
void mma(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  Collective& c = g_warps[cur_warp()];
  const int lane = cur_lane();
  for (int i = 0; i < 4; ++i) c.in_u[lane][i] = a[i];
  c.in_u[lane][4] = b0;
  c.in_u[lane][5] = b1;
  for (int i = 0; i < 4; ++i) c.in_f[lane][i] = acc[i];
  warp_collective("mma", [&](Collective& cc) {
    double A[16][16], B[16][8], C[16][8];
    auto half_of = [](uint32_t reg, int which) { return static_cast<uint16_t>(which ? reg >> 16 : reg & 0xffff); };
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      for (int e = 0; e < 8; ++e) {
        const int row = (e < 2 || (e >= 4 && e < 6)) ? g : g + 8;
        const int col = 2 * t + (e & 1) + (e >= 4 ? 8 : 0);
        A[row][col] = to_double<T>(half_of(cc.in_u[l][e / 2], e & 1));
      }
      for (int e = 0; e < 4; ++e) {
        const int k = 2 * t + (e & 1) + (e >= 2 ? 8 : 0);
        B[k][g] = to_double<T>(half_of(cc.in_u[l][4 + e / 2], e & 1));
      }
      for (int e = 0; e < 4; ++e) C[e < 2 ? g : g + 8][2 * t + (e & 1)] = cc.in_f[l][e];
    }
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      for (int e = 0; e < 4; ++e) {
        const int row = e < 2 ? g : g + 8, col = 2 * t + (e & 1);
        double d = C[row][col];
        for (int k = 0; k < 16; ++k) d += A[row][k] * B[k][col];
        cc.out_f[l][e] = static_cast<float>(d);
      }
    }
  });
  for (int i = 0; i < 4; ++i) acc[i] = c.out_f[lane][i];
}

}  // namespace emu

#define __any_sync(mask, pred) ::emu::any_sync(pred)

// The kernel's PTX wrappers (the ones emu_common.h has not defined; not compiled under TILED_ATTN_EMULATION).
namespace tiled_attn {
namespace flash_fwd {
inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) { emu::ldmatrix(r, addr, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) { emu::ldmatrix(r, addr, true); }
template <typename T>
inline void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu::mma<T>(c, a, b0, b1);
}
inline void st_shared_b32(void* p, uint32_t v) { emu::st_shared(smem_u32(p), &v, 4); }
inline uint4 ld_shared_b128(const void* p) {
  uint4 v;
  emu::ld_shared(smem_u32(p), &v, 16);
  return v;
}
}  // namespace flash_fwd
}  // namespace tiled_attn

#include "attention/attention_merge.cuh"
#include "attention/flash_fwd_launch.cuh"
#include "attention/sweep/flash_fwd_sweep.cuh"

// launch_kernel (declared in flash_fwd_launch.cuh, which uses <<<>>> on the GPU), for the emulator:
// same grid, same slices, every CTA run in turn. Everything above it (the per-head-dim TileConfig
// dispatch, the kFold sibling for scale <= 0) is the GPU build's own code.
namespace tiled_attn {
namespace flash_fwd {
template <class Tr, typename T>
cudaError_t launch_kernel(Params params, int batch_heads, cudaStream_t) {
  const unsigned m_blocks = static_cast<unsigned>((params.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM);
  return emu::launch_grid<Tr>(params, batch_heads, kMaxGridY, m_blocks, 1,
                              [](const Params& p) { flash_fwd_kernel<Tr, T>(p); });
}

// The split-KV kernel's launch (flash_fwd_launch.cuh): the same grid, grid.z the key splits.
template <class Tr, typename T>
cudaError_t launch_split_kernel(Params params, int slots, cudaStream_t) {
  const unsigned m_blocks = static_cast<unsigned>((params.seqlen_q * params.group + Tr::kBlockM - 1) / Tr::kBlockM);
  return emu::launch_grid<Tr>(params, slots, kMaxGridY, m_blocks, static_cast<unsigned>(params.num_splits),
                              [](const Params& p) { flash_fwd_kernel<Tr, T, true>(p); });
}
// The merge kernel's launch (attention_merge.cu): the same 1-D grid of kMergeThreads-thread blocks.
template <int kHeadDim, typename T>
cudaError_t launch_merge_kernel(const MergeParams& p, cudaStream_t) {
  const int64_t blocks = (p.rows * (kHeadDim / 4) + kMergeThreads - 1) / kMergeThreads;
  emu::g_smem_bytes = 0;
  emu::g_grid_dim = {static_cast<unsigned>(blocks), 1, 1};
  for (int64_t bx = 0; bx < blocks; ++bx) {
    emu::g_block_idx = {static_cast<unsigned>(bx), 0, 0};
    emu::run_block(kMergeThreads, [&] { attention_merge_kernel<kHeadDim, T>(p); });
  }
  return cudaSuccess;
}
}  // namespace flash_fwd
}  // namespace tiled_attn

#include "attention/attention_merge.cu"
#include "attention/flash_fwd.cu"

// ------------------------------------------------------------------------------------------------
// Cases
// ------------------------------------------------------------------------------------------------
namespace {

using emu_cases::Case;
using emu_cases::kZeroScale;

// Who runs a case: attention_fwd (the extension's entry: TileConfig dispatch) or one sweep variant.
using Launcher = std::function<cudaError_t(tiled_attn::AttnDtype, const void*, const void*, const void*, void*, float*,
                                           const Case&, tiled_attn::AttnStrides, tiled_attn::AttnStrides,
                                           tiled_attn::AttnStrides, float)>;

cudaError_t via_attention_fwd(tiled_attn::AttnDtype dtype, const void* q, const void* k, const void* v, void* out,
                              float* lse, const Case& c, tiled_attn::AttnStrides qs, tiled_attn::AttnStrides ks,
                              tiled_attn::AttnStrides os, float scale) {
  if (c.splits == 0) {
    return tiled_attn::attention_fwd(dtype, q, k, v, out, lse, c.b, c.hq, c.hkv, c.nq, c.nk, c.d, qs, ks, ks, os,
                                     scale, c.causal, c.offset, nullptr);
  }
  // Split-KV: the workspace NaN-poisoned (a partial the merge reads unwritten shows in the output)
  // between guards that must stay untouched.
  const int64_t floats = tiled_attn::attention_split_workspace_floats(c.b, c.hq, c.nq, c.d, c.splits);
  const int guard = 64;
  std::vector<float> ws(static_cast<size_t>(floats) + 2 * guard, std::nanf(""));
  const std::vector<float> poison = ws;
  const cudaError_t err =
      tiled_attn::attention_fwd_split(dtype, q, k, v, out, lse, ws.data() + guard, c.splits, c.b, c.hq, c.hkv, c.nq,
                                      c.nk, c.d, qs, ks, ks, os, scale, c.causal, c.offset, nullptr);
  if (err != cudaSuccess) return err;
  for (int i = 0; i < guard; ++i) {
    if (!std::isnan(ws[i]) || !std::isnan(ws[ws.size() - 1 - i])) emu::fail("split kernel wrote outside its workspace");
  }
  // Every partial written (acc, m, l of every row and split): none left NaN.
  for (int64_t i = 0; i < floats; ++i) {
    if (std::isnan(ws[guard + i])) emu::fail("workspace element " + std::to_string(i) + " not written by the split kernel");
  }
  return err;
}

// Sweep variant I through make_params and run_flash_fwd_cfg (so a kFold variant at scale <= 0 runs
// its sibling without the fold, as the extension would).
template <int I>
cudaError_t via_variant(tiled_attn::AttnDtype dtype, const void* q, const void* k, const void* v, void* out,
                        float* lse, const Case& c, tiled_attn::AttnStrides qs, tiled_attn::AttnStrides ks,
                        tiled_attn::AttnStrides os, float scale) {
  namespace ff = tiled_attn::flash_fwd;
  ff::Params p;
  int batch_heads;
  const cudaError_t err = ff::make_params(q, k, v, out, lse, c.b, c.hq, c.hkv, c.nq, c.nk, qs, ks, ks, os, scale,
                                          c.causal, c.offset, p, batch_heads);
  if (err != cudaSuccess || batch_heads == 0) return err;
  constexpr int kD = ff::kSweep[I].head_dim;
  if constexpr (ff::kSweepWs<I>) {  // the sm90 kernel's rows (not this kernel): not run here
    return cudaErrorNotSupported;
  } else {
    if (dtype == tiled_attn::AttnDtype::kFloat16) return ff::run_flash_fwd_cfg<kD, ff::SweepCfg<I>, __half>(p, batch_heads, nullptr);
    return ff::run_flash_fwd_cfg<kD, ff::SweepCfg<I>, __nv_bfloat16>(p, batch_heads, nullptr);
  }
}
template <size_t... I>
std::vector<Launcher> variant_launchers(std::index_sequence<I...>) {
  return {Launcher(via_variant<static_cast<int>(I)>)...};
}

// A case run by `launch`, named `who` in its result line.
emu_cases::CaseRun case_run(const Case& c, const Launcher& launch, const std::string& who) {
  emu_cases::CaseRun run;
  run.tag = who;
  run.entry = "attention_fwd";
  run.unwritten = "unwritten?";
  run.prepare = [&](std::mt19937&) { return "splits=" + std::to_string(c.splits); };
  run.launch = [&](tiled_attn::AttnDtype dtype, const void* q, const void* k, const void* v, void* out, float* lse,
                   tiled_attn::AttnStrides qs, tiled_attn::AttnStrides ks, tiled_attn::AttnStrides os, float scale) {
    return launch(dtype, q, k, v, out, lse, c, qs, ks, os, scale);
  };
  return run;
}

}  // namespace

// Optional arguments: a head dim (0: all), a seed, and which kernels: "default" (attention_fwd: the
// TileConfig rows), "variants" (every sweep variant of that head dim), or "all" (the default).
int main(int argc, char** argv) {
  const emu_cases::Args args = emu_cases::parse_args(argc, argv);
  const int only_d = args.only_d;
  const std::string which = argc > 3 ? argv[3] : "all";
  std::mt19937 rng(args.seed);
  // Cases per head dim; `core` ones also run for every sweep variant of that head dim.
  std::vector<std::pair<Case, bool>> cases;
  for (int d : {32, 64, 96, 128, 192, 256}) {
    if (only_d && d != only_d) continue;
    const bool bf = d % 64 != 0;  // alternate the dtype across head dims; both on D = 64 and 128 below
    // ragged, several key tiles, GQA; non-causal
    cases.push_back({{2, 4, 2, 77, 150, d, false, 0, bf}, true});
    // bottom-right causal with Nq < Nk, two query tiles for the 64-row configs
    cases.push_back({{1, 2, 1, 100, 203, d, true, 203 - 100, !bf}, true});
    // Nq > Nk bottom-right: the first rows see no key (output 0, lse -inf)
    cases.push_back({{1, 2, 2, 150, 70, d, true, 70 - 150, bf}, true});
    // several query tiles of the 256-row configs, ragged both ways, rows with no key; the other dtype
    cases.push_back({{1, 1, 1, 300, 290, d, true, -20, !bf}, true});
    // negative and zero scale (kFold's sibling path): full tiles, non-causal and causal
    cases.push_back({{1, 1, 1, 64, 128, d, false, 0, bf, -0.3}, true});
    cases.push_back({{1, 1, 1, 64, 128, d, true, 64, !bf, kZeroScale}, true});
    if (d == 64 || d == 128) {
      // top-left causal over two query tiles (diagonal inside tiles), MQA, the other dtype
      cases.push_back({{1, 3, 1, 200, 200, d, true, 0, bf}, false});
      cases.push_back({{1, 3, 1, 200, 200, d, true, 0, !bf}, false});
      // one query, one key; no keys at all; an offset past every key (nothing masked)
      cases.push_back({{1, 1, 1, 1, 1, d, false, 0, false}, true});
      cases.push_back({{1, 2, 1, 5, 0, d, false, 0, true}, true});
      cases.push_back({{1, 1, 1, 130, 65, d, true, 1 << 30, false}, false});
      cases.push_back({{1, 1, 1, 33, 65, d, true, -(1LL << 40), true}, false});
    }
    // Split-KV (attention_fwd_split: flash_fwd_kernel<Tr, T, true> and the merge kernel). Every head
    // dim: Nq = 1 with GQA group 4 packed in one tile, and Nq = 3 causal where the last split is
    // invisible to queries 0 and 1 (keys [128, 129) past their limits 127 and 128).
    cases.push_back({{1, 4, 1, 1, 150, d, false, 0, bf, 0, 3}, false});
    cases.push_back({{1, 4, 2, 3, 129, d, true, 129 - 3, !bf, 0, 3}, false});
    if (d == 64 || d == 128) {
      // Nq = 1, group 4 (B = 2, Hq = 8, Hkv = 2), ragged Nk, 1 to 7 splits (Nk = 1 with 2 splits and
      // Nk = 239 with 7: splits past the keys, which write the identity).
      const std::pair<int, int> decode[] = {{1, 1}, {1, 2}, {239, 1}, {239, 4}, {239, 7}, {799, 5}, {4099, 7}};
      int n = 0;
      for (const auto& [nk, splits] : decode) {
        cases.push_back({{2, 8, 2, 1, nk, d, false, 0, (n++ % 2) != 0, 0, splits}, false});
      }
      // Nq = 1 bottom-right causal (sees every key), group 1 (MHA) and group 4
      cases.push_back({{1, 2, 2, 1, 799, d, true, 799 - 1, bf, 0, 3}, false});
      cases.push_back({{1, 4, 1, 1, 4099, d, true, 4099 - 1, !bf, 0, 6}, false});
      // Nq = 3, group 4, bottom-right causal: 6 splits over 239 keys (4 of 64, 2 past the keys), 7 over
      // 799 and 4099
      cases.push_back({{1, 8, 2, 3, 239, d, true, 239 - 3, bf, 0, 6}, false});
      cases.push_back({{1, 8, 2, 3, 799, d, true, 799 - 3, !bf, 0, 7}, false});
      cases.push_back({{1, 4, 1, 3, 4099, d, true, 4099 - 3, bf, 0, 7}, false});
      // Nq = 3, MQA group 8: 24 packed rows over two 16-row tiles; top-left causal (rows see 1-3 keys:
      // splits 1-4 empty for every row), and non-causal with group 1
      cases.push_back({{1, 8, 1, 3, 799, d, true, 0, !bf, 0, 5}, false});
      cases.push_back({{2, 3, 3, 3, 239, d, false, 0, bf, 0, 2}, false});
      // Nq > Nk: queries 0 and 1 see no key (output 0, lse -inf) in every split
      cases.push_back({{1, 4, 2, 3, 1, d, true, 1 - 3, !bf, 0, 2}, false});
      // negative and zero scale (the kFold sibling of the split kernel)
      cases.push_back({{1, 4, 1, 1, 239, d, false, 0, bf, -0.3, 3}, false});
      cases.push_back({{1, 4, 1, 3, 239, d, true, 239 - 3, !bf, kZeroScale, 3}, false});
    }
  }
  namespace ff = tiled_attn::flash_fwd;
  const std::vector<Launcher> variants = variant_launchers(std::make_index_sequence<ff::kNumSweep>{});
  int failed = 0, ran = 0;
  auto run = [&](const Case& c, const Launcher& launch, const std::string& who) {
    emu_cases::run_counted(c, rng, case_run(c, launch, who), failed, ran);
  };

  for (const auto& [c, core] : cases) {
    if (which != "variants") run(c, via_attention_fwd, "default");
    if (which == "default" || !core) continue;
    for (int i = 0; i < ff::kNumSweep; ++i) {
      if (ff::kSweep[i].head_dim == c.d && !(ff::kSweep[i].flags & ff::sweep_flags::kWs)) {
        run(c, variants[i], "variant" + std::to_string(i));
      }
    }
  }
  std::printf("%d of %d cases failed\n", failed, ran);
  return failed ? 1 : 0;
}
