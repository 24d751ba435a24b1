// flash_fwd_sm90_ws_kernel.cuh: the warp-specialized wgmma attention forward, FlashAttention-3's
// producer/consumer structure over flash_fwd_sm90_kernel.cuh's math (same wgmma products, same
// softmax_tile, same shared-memory layout). What changes is how tiles arrive and who waits:
//   warpgroup 0, the producer: one thread issues TMA tile loads (cp.async.bulk.tensor through
//     host-made CUtensorMaps) of Q once and of K and V into a kStages ring; each slot has a "K full"
//     and a "V full" mbarrier (the TMA's bytes complete them) and an "empty" one (the consumers
//     arrive after their last read of the slot). The warpgroup gives its registers back
//     (setmaxnreg.dec to 24, 32 beside three consumers) and its other three warps exit at once.
//   warpgroups 1..kConsumers (two, three at D = 64), the consumers: 64 query rows each
//     (setmaxnreg.inc to 240, or 160 with three: the S and O accumulators and P), wait for a slot's
//     K, compute S = Q Kᵀ, the online softmax, wait for V, O += P V, and free the slot. No
//     __syncthreads in the loop: the consumers run independently and the producer runs kStages
//     tiles ahead of the slowest one. The tile (rows x keys) per head dim: flash_fwd_sm90_ws_traits.cuh.
// Compared with the cp.async kernel this removes the consumers' copy instructions and address math,
// the per-tile wait_group and the CTA-wide barrier per tile (which kept both warpgroups in lockstep).
// Inside a consumer, one tile's softmax overlaps the previous tile's P V (below). Not yet: the
// ping-pong of the two consumers (FA3 §3.1), a persistent tile scheduler.
//
// TMA does what the cp.async kernel's predicates did: a box past the end of the keys (or queries) is
// zero-filled, and the tensor maps carry the 64-bit strides (coordinates are 32-bit indices). The
// 128-byte swizzle of the maps lays each 64-column block out exactly as swizzled_offset does (chunk
// c of row r at c ^ (r % 8)), so the descriptors and the emulator's layout checks are the cp.async
// kernel's. The box is 64 columns (128 bytes, the swizzle's limit) by the tile's rows: D / 64 boxes
// a tile, block b at b·rows·128 bytes (D = 96: two blocks, the second half zeros: WsTraits::kTileD).
// Epilogue: each warp stages its own 16 rows of O in the (then free) Q rows it owns and stores them
// with 16-byte row-contiguous stores; a __syncwarp orders the two (no CTA barrier needed).
// tests/emulation/flash_fwd_sm90_emulator.cpp runs this kernel too (mbarrier phases, tx counts and
// TMA completion emulated, completion deferred to a random later point of the schedule).
#pragma once

#include "flash_fwd_sm90_kernel.cuh"
#include "flash_fwd_sm90_ws_traits.cuh"
#include "tma.cuh"

namespace tiled_attn {
namespace flash_fwd_sm90 {

// The three tensor maps (Q, K, V over (D, N, H, B), innermost first), passed as one __grid_constant__
// kernel parameter: TMA reads a map from parameter space by its generic address.
struct TmaMaps {
  CUtensorMap q, k, v;
};

template <class Tr, typename T>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    flash_fwd_sm90_ws_kernel(const Params p, const __grid_constant__ TmaMaps maps) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t sQ = (smem_u32(smem_raw) + 1023u) & ~1023u;  // every tile 1024-byte aligned
  const uint32_t sK = sQ + Tr::kQBytes;
  const uint32_t sV = sK + Tr::kStages * Tr::kKVBytes;
  const uint32_t sBar = sV + Tr::kStages * Tr::kKVBytes;
  const uint32_t bar_q = sBar;
  auto full_k = [&](int s) { return sBar + 8u * (1 + s); };
  auto full_v = [&](int s) { return sBar + 8u * (1 + Tr::kStages + s); };
  // empty: the slot's release (K and V together), or with kSplitRelease K's; empty_v: V's release.
  auto empty = [&](int s) { return sBar + 8u * (1 + 2 * Tr::kStages + s); };
  auto empty_v = [&](int s) { return sBar + 8u * (1 + 3 * Tr::kStages + s); };

  const int tid = threadIdx.x;
  const int wg = tid / 128;

  const CtaTile<Tr> cta(p);
  const int n_tiles = cta.n_tiles;

  if (tid == 0) {
    mbar_init(bar_q, 1);
#pragma unroll
    for (int s = 0; s < Tr::kStages; ++s) {
      mbar_init(full_k(s), 1);
      mbar_init(full_v(s), 1);
      mbar_init(empty(s), Tr::kConsumerThreads);
      if constexpr (Tr::kSplitRelease) mbar_init(empty_v(s), Tr::kConsumerThreads);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer ----
    setmaxnreg_dec<Tr::kProducerRegs>();
    if (tid == 0) {
      // Q is loaded even with no key tile: the consumers wait for it before they reuse its shared
      // memory, so no TMA is still writing there when the CTA's stores read it back.
      mbar_arrive_expect_tx(bar_q, Tr::kQBytes);
#pragma unroll
      for (int b = 0; b < Tr::kColBlocks; ++b)
        tma_load_4d(sQ + b * Tr::kBlockM * 128, &maps.q, bar_q, 64 * b, cta.m0, cta.head, cta.batch);
      // One K or V tile (keys from n0) into slot s of its ring (base), completing barrier `full`.
      auto load = [&](uint32_t base, const CUtensorMap* map, uint32_t full, int s, int n0) {
        mbar_arrive_expect_tx(full, Tr::kKVBytes);
#pragma unroll
        for (int b = 0; b < Tr::kColBlocks; ++b)
          tma_load_4d(base + s * Tr::kKVBytes + b * Tr::kBlockN * 128, map, full, 64 * b, n0, cta.head_kv, cta.batch);
      };
      auto load_k = [&](int s, int n0) { load(sK, &maps.k, full_k(s), s, n0); };
      auto load_v = [&](int s, int n0) { load(sV, &maps.v, full_v(s), s, n0); };
      // Round r of a slot waits for the consumers' r-th release of it (phase r − 1); round 0 passes.
      auto released = [](int it) { return ((it / Tr::kStages) & 1) ^ 1; };
      if constexpr (Tr::kSplitRelease) {
        // K_{i+1} before V_i: the consumers need K_{i+1} (for S_{i+1}) before they are done with V_i.
        if (n_tiles > 0) load_k(0, cta.key0(0));
        for (int it = 0; it < n_tiles; ++it) {
          if (it + 1 < n_tiles) {
            mbar_wait(empty((it + 1) % Tr::kStages), released(it + 1));
            load_k((it + 1) % Tr::kStages, cta.key0(it + 1));
          }
          mbar_wait(empty_v(it % Tr::kStages), released(it));
          load_v(it % Tr::kStages, cta.key0(it));
        }
      } else {
        for (int it = 0; it < n_tiles; ++it) {
          const int s = it % Tr::kStages;
          mbar_wait(empty(s), released(it));
          const int n0 = cta.key0(it);
          load_k(s, n0);
          load_v(s, n0);
        }
      }
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<Tr::kConsumerRegs>();
  const int cw = wg - 1;  // this warpgroup's rows: 64cw .. 64cw + 63 of the tile
  const int warp = (tid % 128) / kWarpSize, lane = tid % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int row0 = cw * 64 + warp * 16 + g;  // this thread's rows: row0 and row0 + 8
  const int limit_base = cta.limit_base(p, row0);

  float acc[Tr::kORegs];
#pragma unroll
  for (int i = 0; i < Tr::kORegs; ++i) acc[i] = 0.f;
  AttnRowState rs[2] = {AttnRowState::identity(), AttnRowState::identity()};

  const uint64_t desc_q0 = make_desc_sw128(sQ + cw * 64 * 128, 16, 1024);
  const uint64_t desc_k0 = make_desc_sw128(sK, 16, 1024);
  const uint64_t desc_v0 = make_desc_sw128(sV, Tr::kBlockN * 128, 1024);

  // Intra-warpgroup pipelining (FA3 §3.2): iteration it issues S_it = Q K_itᵀ and O += P_{it-1} V_{it-1}
  // back to back, waits for S_it only (wait_group 1) and runs its softmax while the P V product is
  // still on the tensor cores; then waits for P V, frees slot it − 1, rescales O by alpha_it and
  // rounds P_it into the A fragments (which the P V in flight read until then: two registers sets
  // are not needed, the float S is exponentiated in place first). S, P and O are live together:
  // the reason for the 240-register consumers.
  float sc[Tr::kSRegs];
  uint32_t pa[Tr::kPVSteps][4];
  float alpha[2];
  auto issue_qk = [&](int it) {
    const int s = it % Tr::kStages;
    mbar_wait(full_k(s), (it / Tr::kStages) & 1);
    qk_product<Tr, T>(sc, desc_q0, desc_advance(desc_k0, s * Tr::kKVBytes));
  };
  auto issue_pv = [&](int it) {
    const int s = it % Tr::kStages;
    mbar_wait(full_v(s), (it / Tr::kStages) & 1);
    pv_product<Tr, T>(acc, pa, desc_advance(desc_v0, s * Tr::kKVBytes));
  };
  auto softmax = [&](int it) { cta.softmax(p, it, sc, alpha, rs, limit_base, t); };
  // The consumers' releases: K_it once S_it has landed (kSplitRelease), V_it (or the whole slot) once
  // P_it V_it has.
  auto release_k = [&](int it) {
    if constexpr (Tr::kSplitRelease) mbar_arrive(empty(it % Tr::kStages));
  };
  auto release_v = [&](int it) {
    mbar_arrive(Tr::kSplitRelease ? empty_v(it % Tr::kStages) : empty(it % Tr::kStages));
  };
  auto rescale_and_pack = [&] {
#pragma unroll
    for (int i = 0; i < Tr::kORegs; ++i) acc[i] *= alpha[(i / 2) % 2];
    pack_p<Tr, T>(sc, pa);
  };

  mbar_wait(bar_q, 0);
  if (n_tiles > 0) {
    wgmma_fence();
    issue_qk(0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(sc);
    release_k(0);
    softmax(0);
    rescale_and_pack();
    for (int it = 1; it < n_tiles; ++it) {
      fence_operands(acc);
      fence_operands(pa);
      wgmma_fence();
      issue_qk(it);
      wgmma_commit();
      issue_pv(it - 1);
      wgmma_commit();
      wgmma_wait<1>();  // S_it has landed; P_{it-1} V_{it-1} may still run
      fence_operands(sc);
      release_k(it);  // this thread's reads of K_it are done
      softmax(it);
      wgmma_wait<0>();
      fence_operands(acc);
      release_v(it - 1);  // and of V_{it-1} (without kSplitRelease: of slot it − 1)
      rescale_and_pack();
    }
    fence_operands(acc);
    fence_operands(pa);
    wgmma_fence();
    issue_pv(n_tiles - 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(acc);
    release_v(n_tiles - 1);
  }

  // Epilogue: the warp's 16 rows of O / l into its own rows of the Q tile (Q was waited for above, and
  // every wgmma reading it completed before this warpgroup's last P V was issued), then 16-byte stores.
  stage_output<Tr, T>(acc, rs, sQ, row0, t, cta.rows_q, p.lse + int64_t{cta.bh} * p.seqlen_q + cta.m0);
  __syncwarp();
  // The warp's 16 rows of D / 8 16-byte chunks (a row's chunks on consecutive lanes), 32 a step: 16
  // rows x 12 chunks at D = 96 take 6 steps, a step then spanning parts of three rows.
  constexpr int kChunks = Tr::kHeadDim / 8;
  T* const gO = static_cast<T*>(p.out) + int64_t{cta.batch} * p.o_batch + int64_t{cta.head} * p.o_head;
#pragma unroll
  for (int i = 0; i < 16 * kChunks / kWarpSize; ++i) {
    const int idx = i * kWarpSize + lane;
    const int r = cw * 64 + warp * 16 + idx / kChunks, chunk = idx % kChunks;
    if (r < cta.rows_q) {
      *reinterpret_cast<uint4*>(gO + int64_t{cta.m0 + r} * p.o_seq + chunk * 8) =
          ld_shared_b128(sQ + swizzled_offset<Tr::kBlockM>(r, chunk));
    }
  }
}

}  // namespace flash_fwd_sm90
}  // namespace tiled_attn
