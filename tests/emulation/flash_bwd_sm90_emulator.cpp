// flash_bwd_sm90_emulator.cpp: runs csrc/attention/sm90/flash_bwd_sm90_kernel.cuh (the wgmma attention
// backward: a TMA producer warpgroup, two consumer warpgroups) on the CPU, unchanged, through its entry
// attention_bwd_sm90. What a host compiler cannot run is emulated from the PTX ISA: wgmma (with
// imm-trans-a, N = 32), mbarrier, TMA loads and reduce-adds (cp.reduce.async.bulk.tensor, its bulk
// groups), setmaxnreg and bar.sync on named barriers are sm90_emu.h's (shared with
// flash_fwd_sm90_emulator.cpp); cp.async, st/ld.shared, __syncthreads, the fibers and the race checks
// are emu_common.h's. The dynamic shared memory window starts at a
// random 16-byte-aligned address and one warpgroup in two cases lags the others (as in the forward's).
// Per case, against a float64 reference on the same rounded inputs, with lse and delta computed here
// (lse of the scaled scores, out rounded to the dtype, delta = rowsum(dout · out), both float32, as
// the kernel gets them): dq (scale · dq_accum), dk and dv within tol · max(max|ref|, 1e-3) (fp16 2e-2,
// bf16 6e-2: P and dS are rounded to 16 bits before their products, dk / dv to 16 bits at the end);
// every dk / dv element written (they start NaN), nothing written outside dk / dv / dq_accum (guards,
// stride padding), the dq reduce-adds only into dq_accum (tma_reduce_add_4d's check).
//
// Build and run (CPU only; tests/test_cuda_attention_bwd_sm90.py does this):
//   g++ -std=c++17 -O1 -Wno-attributes -I<cuda>/include -Icsrc -DTILED_ATTN_EMULATION
//       tests/emulation/flash_bwd_sm90_emulator.cpp -o /tmp/flash_bwd_sm90_emulator && /tmp/flash_bwd_sm90_emulator
// Optional arguments: a head dim (0: all), a seed (inputs, thread schedule, shared-memory base, which
// warpgroup lags). Environment, for the emulator's own test: TILED_ATTN_EMU_LAG=W (warpgroup W lags in
// every case), TILED_ATTN_EMU_MUTATE=short_count (the slot-release mbarriers count one consumer
// warpgroup fewer), short_named (named barriers release half the threads they name) or no_bulk_wait
// (cp.async.bulk.wait_group.read returns at once): bugs the emulator must catch.
#define EMU_KERNEL_NAMESPACE flash_fwd_sm90
#include "emu_common.h"
#include "sm90_emu.h"

#include "attention/sm90/flash_bwd_sm90_launch.cuh"

namespace tiled_attn {
namespace flash_fwd_sm90 {
template <class Tr, typename T>
cudaError_t launch_bwd_kernel(BwdParams params, const BwdMaps& maps, int64_t slots, cudaStream_t) {
  const unsigned n_blocks = static_cast<unsigned>((params.seqlen_k + Tr::kBlockN - 1) / Tr::kBlockN);
  return emu::launch_grid<Tr>(params, slots, kMaxGridY, n_blocks, 1,
                              [&maps](const BwdParams& p) { flash_bwd_sm90_kernel<Tr, T>(p, maps); });
}
}  // namespace flash_fwd_sm90
}  // namespace tiled_attn

#include "attention/sm90/flash_bwd_sm90.cu"

// ------------------------------------------------------------------------------------------------
// Cases
// ------------------------------------------------------------------------------------------------
namespace {

using emu_cases::Case;
using emu_cases::to_bits;

int g_block_m = 64;  // the tile of the case being run (attention_bwd_sm90's block_m)
bool g_dkv_f32 = false;  // dk / dv as float32 (BwdParams::dkv_f32: the ring's unrounded partials)
int g_kv_split = 1;      // > 1 (with g_dkv_f32): the GQA group split, dk / dv partials summed here
bool g_longest_first = false;  // BwdParams::longest_first (with the float32 and split cases)

// The dynamic shared memory's base and the lagging warpgroup of a case (as the forward's case_run):
// the producer or a consumer lags in half the cases (TILED_ATTN_EMU_LAG=W: warpgroup W in every case,
// -1 none).
std::string prepare(std::mt19937& rng) {
  emu::g_base = static_cast<uint32_t>(std::uniform_int_distribution<int>(0, 63)(rng)) * 16;
  int lag = std::uniform_int_distribution<int>(-3, 2)(rng);  // < 0: none
  if (const char* forced = std::getenv("TILED_ATTN_EMU_LAG")) lag = std::atoi(forced);
  emu::g_lag_lo = lag < 0 ? 0 : 128 * lag;
  emu::g_lag_hi = lag < 0 ? 0 : 128 * lag + 128;
  char s[48];
  std::snprintf(s, sizeof s, "smem_base=%4u lag=%s", emu::g_base, lag < 0 ? "none" : std::to_string(lag).c_str());
  return s;
}

// q, k, v, dout laid out (B, N, H, D) with the seq stride padded (non-contiguous views); dk, dv
// (B, Hkv·kv_split, Nk, D) with a padded seq stride; dq_accum (B·Hq, Nq, D) contiguous; guards around each.
// With g_kv_split > 1 the reference is compared with the sum of a kv head's partials.
template <typename T>
bool run_case(const Case& c, std::mt19937& rng) {
  const int pad = 8, guard = 64;
  const int64_t q_seq = int64_t{c.hq} * c.d + pad, k_seq = int64_t{c.hkv} * c.d + pad;
  const int64_t q_batch = int64_t{c.nq} * q_seq, k_batch = int64_t{c.nk} * k_seq;
  const int split = g_kv_split;
  const int64_t g_seq = c.d + pad, g_head = int64_t{c.nk} * g_seq, g_batch = int64_t{c.hkv} * split * g_head;
  const int64_t r_batch = int64_t{c.hkv} * g_head;  // the reference dk / dv: (B, Hkv, Nk, D), padded rows
  const size_t r_elems = static_cast<size_t>(c.b) * r_batch;
  const size_t q_elems = static_cast<size_t>(c.b) * q_batch, k_elems = static_cast<size_t>(c.b) * k_batch;
  const size_t g_elems = static_cast<size_t>(c.b) * g_batch;
  const size_t dq_elems = static_cast<size_t>(c.b) * c.hq * c.nq * c.d;
  std::normal_distribution<double> normal(0.0, 1.0);
  auto fill = [&](std::vector<uint16_t>& buf, size_t n) {
    buf.assign(n + 2 * guard, 0);
    for (size_t i = 0; i < n; ++i) buf[guard + i] = to_bits<T>(normal(rng));
  };
  std::vector<uint16_t> q, k, v, dout;
  fill(q, q_elems);
  fill(k, k_elems);
  fill(v, k_elems);
  fill(dout, q_elems);
  const uint16_t kPoison = 0x7e00 | 0x7fc0;  // a NaN in both fp16 and bf16
  std::vector<uint16_t> dk(g_elems + 2 * guard, kPoison), dv(g_elems + 2 * guard, kPoison);
  std::vector<float> dk32(g_dkv_f32 ? g_elems + 2 * guard : 0, std::nanf("")), dv32(dk32);
  void* const dkp = g_dkv_f32 ? static_cast<void*>(dk32.data() + guard) : static_cast<void*>(dk.data() + guard);
  void* const dvp = g_dkv_f32 ? static_cast<void*>(dv32.data() + guard) : static_cast<void*>(dv.data() + guard);
  const float kSentinel = 1234.5f;  // dq_accum's guards (a NaN would not show an add)
  std::vector<float> dq_accum(dq_elems + 2 * guard, 0.f);
  for (int i = 0; i < guard; ++i) dq_accum[i] = dq_accum[dq_accum.size() - 1 - i] = kSentinel;
  const std::string extra = prepare(rng);

  const uint16_t* qp = q.data() + guard;
  const uint16_t* kp = k.data() + guard;
  const uint16_t* vp = v.data() + guard;
  const uint16_t* dop = dout.data() + guard;
  emu::g_inputs = {{reinterpret_cast<const char*>(qp), q_elems * 2},
                   {reinterpret_cast<const char*>(kp), k_elems * 2},
                   {reinterpret_cast<const char*>(vp), k_elems * 2},
                   {reinterpret_cast<const char*>(dop), q_elems * 2}};
  emu::g_red_buffers = {{reinterpret_cast<const char*>(dq_accum.data() + guard), dq_elems * 4}};
  const double scale = static_cast<float>(c.scale != 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.d)));
  auto Q = [&](int b, int h, int i, int e) { return emu::to_double<T>(qp[b * q_batch + i * q_seq + h * c.d + e]); };
  auto DO = [&](int b, int h, int i, int e) { return emu::to_double<T>(dop[b * q_batch + i * q_seq + h * c.d + e]); };
  auto K = [&](int b, int h, int j, int e) { return emu::to_double<T>(kp[b * k_batch + j * k_seq + h * c.d + e]); };
  auto V = [&](int b, int h, int j, int e) { return emu::to_double<T>(vp[b * k_batch + j * k_seq + h * c.d + e]); };
  auto visible = [&](int i, int j) { return !c.causal || j <= i + c.offset; };

  // The forward in float64: scores, lse (float32), out rounded to the dtype, delta (float32).
  const int group = c.hq / c.hkv;
  const size_t rows = static_cast<size_t>(c.b) * c.hq * c.nq;
  std::vector<double> s(rows * c.nk, -INFINITY);  // scaled scores, -inf where not visible
  // lse and delta inside NaN guards: a read past them (plain loads, unchecked here) shows in dq / dk / dv.
  std::vector<float> lse_buf(rows + 2 * guard, std::nanf("")), delta_buf(rows + 2 * guard, std::nanf(""));
  float* const lse = lse_buf.data() + guard;
  float* const delta = delta_buf.data() + guard;
  for (int b = 0; b < c.b; ++b) {
    for (int h = 0; h < c.hq; ++h) {
      for (int i = 0; i < c.nq; ++i) {
        const size_t r = (static_cast<size_t>(b) * c.hq + h) * c.nq + i;
        double* sr = &s[r * c.nk];
        double m = -INFINITY;
        for (int j = 0; j < c.nk; ++j) {
          if (!visible(i, j)) continue;
          double acc = 0;
          for (int e = 0; e < c.d; ++e) acc += Q(b, h, i, e) * K(b, h / group, j, e);
          sr[j] = acc * scale;
          m = std::max(m, sr[j]);
        }
        double l = 0;
        for (int j = 0; j < c.nk; ++j) l += m == -INFINITY ? 0.0 : std::exp(sr[j] - m);
        lse[r] = static_cast<float>(l == 0 ? -INFINITY : m + std::log(l));
        double dl = 0;
        for (int e = 0; e < c.d && l > 0; ++e) {
          double o = 0;
          for (int j = 0; j < c.nk; ++j)
            if (sr[j] != -INFINITY) o += std::exp(sr[j] - m) / l * V(b, h / group, j, e);
          dl += DO(b, h, i, e) * emu::to_double<T>(to_bits<T>(o));
        }
        delta[r] = static_cast<float>(dl);
      }
    }
  }

  const tiled_attn::AttnStrides qs{q_batch, c.d, q_seq}, ks{k_batch, c.d, k_seq}, gs{g_batch, g_head, g_seq};
  const cudaError_t err = tiled_attn::attention_bwd_sm90(
      c.bf16 ? tiled_attn::AttnDtype::kBFloat16 : tiled_attn::AttnDtype::kFloat16, qp, kp, vp, dop, lse, delta,
      dq_accum.data() + guard, dkp, dvp, c.b, c.hq, c.hkv, c.nq, c.nk, c.d, qs, ks, ks, qs,
      gs, gs, static_cast<float>(scale), c.causal, c.offset, g_block_m, g_dkv_f32, split, g_longest_first, nullptr);
  if (err != cudaSuccess) emu::fail("attention_bwd_sm90 returned " + std::to_string(static_cast<int>(err)));

  // The gradients in float64 from the same lse and delta: P = exp(s − lse), dS = P (dout·v − delta).
  std::vector<double> rdq(dq_elems, 0.0), rdk(r_elems, 0.0), rdv(r_elems, 0.0);
  for (int b = 0; b < c.b; ++b) {
    for (int h = 0; h < c.hq; ++h) {
      const int hk = h / group;
      for (int i = 0; i < c.nq; ++i) {
        const size_t r = (static_cast<size_t>(b) * c.hq + h) * c.nq + i;
        if (lse[r] == -INFINITY) continue;  // no visible key: contributes nothing
        for (int j = 0; j < c.nk; ++j) {
          if (s[r * c.nk + j] == -INFINITY) continue;
          const double p = std::exp(s[r * c.nk + j] - static_cast<double>(lse[r]));
          double dp = 0;
          for (int e = 0; e < c.d; ++e) dp += DO(b, h, i, e) * V(b, hk, j, e);
          const double ds = p * (dp - static_cast<double>(delta[r]));
          const size_t g = static_cast<size_t>(b) * r_batch + hk * g_head + static_cast<size_t>(j) * g_seq;
          for (int e = 0; e < c.d; ++e) {
            rdv[g + e] += p * DO(b, h, i, e);
            rdk[g + e] += scale * ds * Q(b, h, i, e);
            rdq[r * c.d + e] += scale * ds * K(b, hk, j, e);
          }
        }
      }
    }
  }

  // Errors, finiteness (every element written), and nothing written outside the elements.
  auto where = [&](const char* what, int b, int h, int i, int e) {
    return std::string(what) + " at b=" + std::to_string(b) + " h=" + std::to_string(h) + " row=" + std::to_string(i) +
           " e=" + std::to_string(e);
  };
  double err_dq = 0, err_dk = 0, err_dv = 0, max_dq = 0, max_dk = 0, max_dv = 0;
  for (int b = 0; b < c.b; ++b)
    for (int h = 0; h < c.hq; ++h)
      for (int i = 0; i < c.nq; ++i)
        for (int e = 0; e < c.d; ++e) {
          const size_t x = ((static_cast<size_t>(b) * c.hq + h) * c.nq + i) * c.d + e;
          const double got = scale * dq_accum[guard + x], e1 = std::fabs(got - rdq[x]);
          if (!(e1 <= 1e30)) emu::fail(where("dq_accum not finite", b, h, i, e));
          err_dq = std::max(err_dq, e1);
          max_dq = std::max(max_dq, std::fabs(rdq[x]));
        }
  for (int b = 0; b < c.b; ++b)
    for (int h = 0; h < c.hkv; ++h)
      for (int j = 0; j < c.nk; ++j)
        for (int e = 0; e < c.d; ++e) {
          const size_t x = static_cast<size_t>(b) * r_batch + h * g_head + static_cast<size_t>(j) * g_seq + e;
          double gk = 0, gv = 0;
          for (int sp = 0; sp < split; ++sp) {  // partial sp of kv head h: head h·split + sp
            const size_t y = static_cast<size_t>(b) * g_batch + (h * split + sp) * g_head + static_cast<size_t>(j) * g_seq + e;
            gk += g_dkv_f32 ? dk32[guard + y] : emu::to_double<T>(dk[guard + y]);
            gv += g_dkv_f32 ? dv32[guard + y] : emu::to_double<T>(dv[guard + y]);
          }
          if (!(std::fabs(gk - rdk[x]) <= 1e30)) emu::fail(where("dk not finite (unwritten?)", b, h, j, e));
          if (!(std::fabs(gv - rdv[x]) <= 1e30)) emu::fail(where("dv not finite (unwritten?)", b, h, j, e));
          err_dk = std::max(err_dk, std::fabs(gk - rdk[x]));
          err_dv = std::max(err_dv, std::fabs(gv - rdv[x]));
          max_dk = std::max(max_dk, std::fabs(rdk[x]));
          max_dv = std::max(max_dv, std::fabs(rdv[x]));
        }
  auto inside = [&](size_t i, size_t size) {
    return i >= static_cast<size_t>(guard) && i < size - guard && ((i - guard) % g_seq) < static_cast<size_t>(c.d);
  };
  for (const auto* buf : {&dk, &dv}) {  // untouched when the kernel writes float32
    for (size_t i = 0; i < buf->size(); ++i) {
      if ((g_dkv_f32 || !inside(i, buf->size())) && (*buf)[i] != kPoison)
        emu::fail(std::string("write outside ") + (buf == &dk ? "dk" : "dv") + "'s elements at index " +
                  std::to_string(static_cast<long long>(i) - guard));
    }
  }
  for (const auto* buf : {&dk32, &dv32}) {
    for (size_t i = 0; i < buf->size(); ++i) {
      if (!inside(i, buf->size()) && !std::isnan((*buf)[i]))
        emu::fail(std::string("write outside float32 ") + (buf == &dk32 ? "dk" : "dv") + "'s elements at index " +
                  std::to_string(static_cast<long long>(i) - guard));
    }
  }
  for (int i = 0; i < guard; ++i)
    if (dq_accum[i] != kSentinel || dq_accum[dq_accum.size() - 1 - i] != kSentinel) emu::fail("write outside dq_accum");

  const double tol = c.bf16 ? 6e-2 : 2e-2;
  const double rel_dq = err_dq / std::max(max_dq, 1e-3), rel_dk = err_dk / std::max(max_dk, 1e-3),
               rel_dv = err_dv / std::max(max_dv, 1e-3);
  const bool ok = rel_dq <= tol && rel_dk <= tol && rel_dv <= tol;
  std::printf("%s D=%3d bm=%3d %s%s%s%s B=%d Hq=%d Hkv=%d Nq=%4d Nk=%4d causal=%d offset=%5lld scale=%+.3f %s  "
              "max|err|/max|ref|: dq=%.2e dk=%.2e dv=%.2e  (max|ref| dq=%.2e dk=%.2e dv=%.2e)\n",
              ok ? "ok  " : "FAIL", c.d, g_block_m, c.bf16 ? "bf16" : "fp16", g_dkv_f32 ? " dkv=f32" : "",
              split > 1 ? (" kv_split=" + std::to_string(split)).c_str() : "", g_longest_first ? " lf" : "", c.b, c.hq, c.hkv, c.nq, c.nk, c.causal,
              static_cast<long long>(c.offset), scale, extra.c_str(), rel_dq, rel_dk, rel_dv, max_dq, max_dk, max_dv);
  std::fflush(stdout);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const emu_cases::Args args = emu_cases::parse_args(argc, argv);
  std::mt19937 rng(args.seed);
  try {
    emu::check_layout_tables();
  } catch (const std::exception& e) {
    std::printf("FAIL %s\n", e.what());
    return 1;
  }
  std::vector<Case> cases;
  for (int d : {64, 128}) {
    if (args.only_d && d != args.only_d) continue;
    const bool bf = d == 128;  // alternate the dtype across head dims and cases
    cases.push_back({1, 1, 1, 64, 128, d, false, 0, !bf});           // one key tile, one query tile
    cases.push_back({1, 1, 1, 1, 1, d, false, 0, bf});               // one query, one key
    cases.push_back({1, 2, 1, 113, 203, d, true, 203 - 113, !bf});   // bottom-right causal, GQA 2
    cases.push_back({2, 2, 2, 128, 217, d, false, 0, bf});           // ragged keys, two batches
    cases.push_back({1, 2, 1, 150, 70, d, true, 70 - 150, !bf});     // Nq > Nk: rows with no key (lse -inf)
    cases.push_back({1, 3, 1, 130, 130, d, true, 0, bf});            // top-left causal, MQA
    cases.push_back({1, 1, 1, 64, 128, d, false, 0, !bf, -0.3});     // negative scale
    cases.push_back({1, 1, 1, 200, 64, d, false, 0, bf});            // several query tiles, ragged
  }
  int failed = 0, ran = 0;
  for (const Case& c : cases) {
   // D = 64 has both tiles; 0: float32 dk / dv (two cases a head dim); -1: the GQA group split among
   // CTAs (the two cases with a group above 1, the group's size: every CTA one query head).
   for (int block_m : {64, 128, 0, -1}) {
    const size_t at = static_cast<size_t>(&c - cases.data()) % 8;
    if ((block_m == 128 && c.d != 64) || (block_m == 0 && at != 2 && at != 4) ||
        (block_m == -1 && at != 2 && at != 5)) {
      continue;
    }
    g_dkv_f32 = block_m <= 0;
    g_kv_split = block_m == -1 ? c.hq / c.hkv : 1;
    g_longest_first = block_m <= 0;
    g_block_m = block_m <= 0 ? (c.d == 64 ? 128 : 64) : block_m;
    ++ran;
    try {
      const bool ok = c.bf16 ? run_case<__nv_bfloat16>(c, rng) : run_case<__half>(c, rng);
      if (!ok) ++failed;
    } catch (const std::exception& e) {
      ++failed;
      // A check inside the kernel fired in the fiber the scheduler last ran (g_cur): name it.
      std::string at;
      if (emu::g_cur >= 0 && emu::g_cur < static_cast<int>(emu::g_fibers.size()) && !emu::g_error.empty())
        at = " [thread " + std::to_string(emu::g_cur) + " (warpgroup " + std::to_string(emu::g_cur / 128) +
             ") of CTA (" + std::to_string(emu::g_block_idx.x) + ", " + std::to_string(emu::g_block_idx.y) + ")]";
      std::printf("FAIL D=%3d %s B=%d Hq=%d Hkv=%d Nq=%d Nk=%d causal=%d offset=%lld: %s%s\n", c.d,
                  c.bf16 ? "bf16" : "fp16", c.b, c.hq, c.hkv, c.nq, c.nk, c.causal,
                  static_cast<long long>(c.offset), e.what(), at.c_str());
      std::fflush(stdout);
    }
   }
  }
  std::printf("%d of %d cases failed\n", failed, ran);
  return failed ? 1 : 0;
}
