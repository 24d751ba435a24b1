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
// Inside a consumer, one tile's softmax overlaps the previous tile's P V (below). With
// WsTraits::kPersistent the grid is one CTA per SM, each walking query tiles (WsSchedule): the K / V
// ring and Q's full / empty barriers run on across them, so the next tile's Q and first K / V load
// while a tile's last P V and output stores run. With WsTraits::kPingPong (sweep rows only: measured
// slower, ws_ping_pong) the consumers take turns at the tensor cores (FA3 §3.1: a token passed round
// them through named barriers, below).
//
// TMA does what the cp.async kernel's predicates did: a box past the end of the keys (or queries) is
// zero-filled, and the tensor maps carry the 64-bit strides (coordinates are 32-bit indices). The
// 128-byte swizzle of the maps lays each 64-column block out exactly as swizzled_offset does (chunk
// c of row r at c ^ (r % 8)), so the descriptors and the emulator's layout checks are the cp.async
// kernel's. The box is 64 columns (128 bytes, the swizzle's limit) by the tile's rows: D / 64 boxes
// a tile, block b at b·rows·128 bytes (D = 96: two blocks, the second half zeros: WsTraits::kTileD).
// Epilogue: each warp stages its own 16 rows of O in the (then free) Q rows it owns and stores them
// with 16-byte row-contiguous stores; a __syncwarp orders the two (no CTA barrier needed). Persistent,
// Q's shared memory may hold the next tile's Q by then: O goes straight from the accumulators
// (store_output: 4-byte stores, or with WsTraits::kWideStore 16-byte ones after a transpose across
// each quad of lanes; ws_short_block_n says where).
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

// The persistent kernel's tile order (WsTraits::kPersistent; the host's ws_schedule). Tile i of the
// m_blocks x slots query tiles ((batch, head) pairs p.bh_offset + slot): the pairs in sections of
// `section` (whose K and V fit in about half the L2 together), section by section; inside one, the
// query tiles from the last (under a causal mask the longest) to the first, every pair of the section
// at one query tile before the next. The CTAs resident together then share a few pairs' K and V in L2
// (as the one-CTA-per-tile grid's x-fastest order does), and each section ends on its shortest tiles:
// the whole grid's tail is the last section's shortest tiles (longest-processing-time-first).
// With WsTraits::kDynamic the CTAs take the tiles in this order from a counter instead of in turn:
// counter[0] (zeroed before the launch) counts the tiles taken past the grid's first (tile blockIdx.x
// each), counter[1 + b] passes CTA b's producer's pick to its consumers.
struct WsSchedule {
  int64_t tiles;  // m_blocks · slots
  int m_blocks, slots, section;
  int* counter;

  __device__ __forceinline__ void tile(int64_t i, int& m_block, int& slot) const {
    const int64_t per_section = int64_t{section} * m_blocks;
    const int64_t sec = i / per_section;
    const int first = static_cast<int>(sec * section);
    const int pairs = min(section, slots - first);
    const int rank = static_cast<int>(i - sec * per_section);
    m_block = m_blocks - 1 - rank / pairs;
    slot = first + rank % pairs;
  }
};

template <class Tr, typename T>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    flash_fwd_sm90_ws_kernel(const Params p, const __grid_constant__ TmaMaps maps, const WsSchedule sched) {
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
  // Q's release (persistent: the consumers' last read of a tile's Q, before the next tile's load).
  const uint32_t q_empty = sBar + 8u * (Tr::kBarriers - 1);

  const int tid = threadIdx.x;
  const int wg = tid / 128;

  // This CTA's query tiles: its own (one CTA per tile), or (persistent) tiles blockIdx.x, + gridDim.x, ..
  // of the schedule, or (kDynamic) blockIdx.x, then whichever the counter gives its producer.
  const int64_t tile_first = Tr::kPersistent ? blockIdx.x : 0;
  const int64_t tile_end = Tr::kPersistent ? sched.tiles : 1;
  const int64_t tile_step = Tr::kPersistent ? gridDim.x : 1;
  // (kDynamic) Where CTA blockIdx.x's producer leaves its pick: formed where used (not held in
  // registers across the loop: the 24-register producer spilled with it).
  auto pick = [&] { return static_cast<volatile int*>(sched.counter + 1 + blockIdx.x); };
  auto cta_tile = [&](int64_t i) {
    if constexpr (Tr::kPersistent) {
      int m_block, slot;
      sched.tile(i, m_block, slot);
      return CtaTile<Tr>(p, m_block, slot);
    } else {
      return CtaTile<Tr>(p);
    }
  };

  if (tid == 0) {
    mbar_init(bar_q, 1);
#pragma unroll
    for (int s = 0; s < Tr::kStages; ++s) {
      mbar_init(full_k(s), 1);
      mbar_init(full_v(s), 1);
      mbar_init(empty(s), Tr::kConsumerThreads);
      if constexpr (Tr::kSplitRelease) mbar_init(empty_v(s), Tr::kConsumerThreads);
    }
    if constexpr (Tr::kPersistent) mbar_init(q_empty, Tr::kConsumerThreads);
    mbar_fence_init();
  }
  __syncthreads();

  // The K / V ring runs on across a CTA's tiles: `ring` counts the key tiles of its earlier query tiles,
  // so key tile it of this one is the ring's tile ring + it (slot and phase as within one tile).
  if (wg == 0) {
    // ---- producer ----
    setmaxnreg_dec<Tr::kProducerRegs>();
    if (tid == 0) {
      int ring = 0;
      // (A 32-bit index with the counter: the host keeps its tiles below 2^31; the 24-register producer
      // spilled with a 64-bit one.)
      std::conditional_t<Tr::kDynamic, int, int64_t> i = tile_first;
      for (int round = 0;; ++round) {
        if (round > 0) i = Tr::kDynamic ? gridDim.x + atomicAdd(sched.counter, 1) : i + tile_step;
        if (!Tr::kDynamic && i >= tile_end) break;
        // Q is loaded even with no key tile: the consumers wait for it before they go on, so no TMA is
        // still writing there when the CTA ends (or, persistent, when the next Q is loaded). The wait
        // for Q's release also orders the consumers' read of the last pick before the next.
        if (round > 0) mbar_wait(q_empty, (round - 1) & 1);
        if constexpr (Tr::kDynamic) {
          // The pick (-1: none left) reaches the consumers through bar_q's phase: its arrive releases
          // this store, their wait acquires it. With none left, a plain arrive completes the phase.
          *pick() = i < tile_end ? i : -1;
          if (i >= tile_end) {
            mbar_arrive(bar_q);
            break;
          }
        }
        const CtaTile<Tr> cta = cta_tile(i);
        const int n_tiles = cta.n_tiles;
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
        auto load_k = [&](int r, int n0) { load(sK, &maps.k, full_k(r % Tr::kStages), r % Tr::kStages, n0); };
        auto load_v = [&](int r, int n0) { load(sV, &maps.v, full_v(r % Tr::kStages), r % Tr::kStages, n0); };
        // Round q of a slot waits for the consumers' q-th release of it (phase q − 1); round 0 passes.
        auto released = [](int r) { return ((r / Tr::kStages) & 1) ^ 1; };
        if constexpr (Tr::kSplitRelease) {
          // K_{i+1} before V_i: the consumers need K_{i+1} (for S_{i+1}) before they are done with V_i.
          if (n_tiles > 0) {
            mbar_wait(empty(ring % Tr::kStages), released(ring));
            load_k(ring, cta.key0(0));
          }
          for (int it = 0; it < n_tiles; ++it) {
            const int r = ring + it;
            if (it + 1 < n_tiles) {
              mbar_wait(empty((r + 1) % Tr::kStages), released(r + 1));
              load_k(r + 1, cta.key0(it + 1));
            }
            mbar_wait(empty_v(r % Tr::kStages), released(r));
            load_v(r, cta.key0(it));
          }
        } else {
          for (int it = 0; it < n_tiles; ++it) {
            const int r = ring + it;
            mbar_wait(empty(r % Tr::kStages), released(r));
            const int n0 = cta.key0(it);
            load_k(r, n0);
            load_v(r, n0);
          }
        }
        ring += n_tiles;
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

  // Ping-pong (WsTraits::kPingPong, ws_ping_pong): consumer c waits at named barrier 1 + c (256
  // threads: its own 128 at bar.sync, the previous consumer's 128 at bar.arrive) before it issues a key
  // tile's two products, and arrives at the next one's after. Consumer 0 arrives at its own first, so
  // it goes first. The products of a tile's first S and its last P V are issued outside the round
  // (as FA3 does), so each consumer passes the barrier n_tiles − 1 times a query tile, the same count
  // for all (the key tiles are the CTA tile's): the round stays in step across a persistent CTA's
  // tiles, and the last hand-over always reaches consumer 0, which takes it after its last tile.
  if constexpr (Tr::kPingPong) {
    if (cw == 0) named_barrier_arrive(1, 256);
  }

  const uint64_t desc_q0 = make_desc_sw128(sQ + cw * 64 * 128, 16, 1024);
  const uint64_t desc_k0 = make_desc_sw128(sK, 16, 1024);
  const uint64_t desc_v0 = make_desc_sw128(sV, Tr::kBlockN * 128, 1024);

  int ring = 0;
  int64_t i = tile_first;
  for (int round = 0;; ++round) {
    if (!Tr::kDynamic && round > 0) i += tile_step;
    if (!Tr::kDynamic && i >= tile_end) break;
    mbar_wait(bar_q, round & 1);
    if (Tr::kDynamic && round > 0) {
      i = *pick();
      if (i < 0) break;
    }
    const CtaTile<Tr> cta = cta_tile(i);
    const int n_tiles = cta.n_tiles;
    const int limit_base = cta.limit_base(p, row0);

    float acc[Tr::kORegs];
#pragma unroll
    for (int j = 0; j < Tr::kORegs; ++j) acc[j] = 0.f;
    AttnRowState rs[2] = {AttnRowState::identity(), AttnRowState::identity()};

    // Intra-warpgroup pipelining (FA3 §3.2): iteration it issues S_it = Q K_itᵀ and O += P_{it-1} V_{it-1}
    // back to back, waits for S_it only (wait_group 1) and runs its softmax while the P V product is
    // still on the tensor cores; then waits for P V, frees slot it − 1, rescales O by alpha_it and
    // rounds P_it into the A fragments (which the P V in flight read until then: two registers sets
    // are not needed, the float S is exponentiated in place first). S, P and O are live together:
    // the reason for the 240-register consumers.
    float sc[Tr::kSRegs];
    uint32_t pa[Tr::kPVSteps][4];
    float alpha[2];
    auto wait_k = [&](int it) { mbar_wait(full_k((ring + it) % Tr::kStages), ((ring + it) / Tr::kStages) & 1); };
    auto wait_v = [&](int it) { mbar_wait(full_v((ring + it) % Tr::kStages), ((ring + it) / Tr::kStages) & 1); };
    auto issue_qk = [&](int it) {
      qk_product<Tr, T>(sc, desc_q0, desc_advance(desc_k0, (ring + it) % Tr::kStages * Tr::kKVBytes));
    };
    auto issue_pv = [&](int it) {
      pv_product<Tr, T>(acc, pa, desc_advance(desc_v0, (ring + it) % Tr::kStages * Tr::kKVBytes));
    };
    auto softmax = [&](int it) { cta.softmax(p, it, sc, alpha, rs, limit_base, t); };
    // The consumers' releases: K_it once S_it has landed (kSplitRelease), and with the last S of the
    // tile Q (persistent); V_it (or the whole slot) once P_it V_it has.
    auto release_k = [&](int it) {
      if constexpr (Tr::kSplitRelease) mbar_arrive(empty((ring + it) % Tr::kStages));
      if constexpr (Tr::kPersistent) {
        if (it == n_tiles - 1) mbar_arrive(q_empty);
      }
    };
    auto release_v = [&](int it) {
      const int s = (ring + it) % Tr::kStages;
      mbar_arrive(Tr::kSplitRelease ? empty_v(s) : empty(s));
    };
    auto rescale_and_pack = [&] {
#pragma unroll
      for (int j = 0; j < Tr::kORegs; ++j) acc[j] *= alpha[(j / 2) % 2];
      pack_p<Tr, T>(sc, pa);
    };

    if (n_tiles > 0) {
      wait_k(0);
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
        wait_k(it);
        // Ping-pong: both operands' tiles are waited for before the token is taken, so a late load
        // holds up this consumer alone, not the token.
        if constexpr (Tr::kPingPong) {
          wait_v(it - 1);
          named_barrier_sync(1 + cw, 256);
        }
        wgmma_fence();
        issue_qk(it);
        wgmma_commit();
        if constexpr (!Tr::kPingPong) wait_v(it - 1);
        issue_pv(it - 1);
        wgmma_commit();
        if constexpr (Tr::kPingPong) named_barrier_arrive(1 + (cw + 1) % Tr::kConsumers, 256);
        wgmma_wait<1>();  // S_it has landed; P_{it-1} V_{it-1} may still run
        fence_operands(sc);
        release_k(it);  // this thread's reads of K_it (and with the last, of Q) are done
        softmax(it);
        wgmma_wait<0>();
        fence_operands(acc);
        release_v(it - 1);  // and of V_{it-1} (without kSplitRelease: of slot it − 1)
        rescale_and_pack();
      }
      fence_operands(acc);
      fence_operands(pa);
      wait_v(n_tiles - 1);
      wgmma_fence();
      issue_pv(n_tiles - 1);
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(acc);
      release_v(n_tiles - 1);
    } else if constexpr (Tr::kPersistent) {
      mbar_arrive(q_empty);  // no product read Q
    }
    ring += n_tiles;

    float* const lse_row = p.lse + int64_t{cta.bh} * p.seqlen_q + cta.m0;
    T* const gO = static_cast<T*>(p.out) + int64_t{cta.batch} * p.o_batch + int64_t{cta.head} * p.o_head +
                  int64_t{cta.m0} * p.o_seq;
    if constexpr (Tr::kPersistent) {
      // Straight from the accumulators: Q's shared memory, where the one-tile epilogue stages O, may
      // already hold the next tile's Q.
      store_output<Tr, T, Tr::kWideStore>(acc, rs, gO, p.o_seq, row0, t, cta.rows_q, lse_row);
    } else {
      // The warp's 16 rows of O / l into its own rows of the Q tile (Q was waited for above, and every
      // wgmma reading it completed before this warpgroup's last P V was issued), then 16-byte stores.
      stage_output<Tr, T>(acc, rs, sQ, row0, t, cta.rows_q, lse_row);
      __syncwarp();
      // The warp's 16 rows of D / 8 16-byte chunks (a row's chunks on consecutive lanes), 32 a step: 16
      // rows x 12 chunks at D = 96 take 6 steps, a step then spanning parts of three rows.
      constexpr int kChunks = Tr::kHeadDim / 8;
#pragma unroll
      for (int j = 0; j < 16 * kChunks / kWarpSize; ++j) {
        const int idx = j * kWarpSize + lane;
        const int r = cw * 64 + warp * 16 + idx / kChunks, chunk = idx % kChunks;
        if (r < cta.rows_q) {
          *reinterpret_cast<uint4*>(gO + int64_t{r} * p.o_seq + chunk * 8) =
              ld_shared_b128(sQ + swizzled_offset<Tr::kBlockM>(r, chunk));
        }
      }
    }
  }
  // The round's last hand-over (the last consumer's, to consumer 0; or consumer 0's own first arrive
  // if no key tile passed the round) completes here, so no phase is left open at exit.
  if constexpr (Tr::kPingPong) {
    if (cw == 0) named_barrier_sync(1, 256);
  }
}

}  // namespace flash_fwd_sm90
}  // namespace tiled_attn
