// flash_fwd_sm90_kernel.cuh: the attention forward on Hopper's warpgroup MMA (wgmma, sm_90a), beside
// the mma.sync kernel of ../flash_fwd_kernel.cuh. What it adds over that one: Q·Kᵀ and P·V are
// wgmma.mma_async m64nNk16 instructions (a 64 x N x 16 product per instruction and warpgroup instead
// of 16 x 8 x 16 per warp) reading their B operand — and for Q·Kᵀ also A — straight from shared
// memory through a matrix descriptor: no ldmatrix, no per-warp fragment loads. FlashAttention-3's
// consumer structure, simplified: no producer warp, no warp specialization, no ping-pong yet.
//
// One CTA = 2 warpgroups (256 threads) = kBlockM = 128 query rows of one (batch, head); warpgroup w
// owns rows 64w..64w+63 and computes its own S = Q Kᵀ (64 x kBlockN) and O += P V (64 x D).
//   Q:     global -> shared (cp.async, once), resident.
//   K, V:  global -> shared through kStages slots (cp.async, 16-byte chunks, zero-filled past N),
//          one commit group and one __syncthreads per key tile (tile i+kStages-1 is copied while
//          tile i is computed).
//   S:     wgmma SS (A = Q, B = K, both K-major: the head dim is contiguous), D/16 instructions into a
//          kBlockN/2-register f32 accumulator per thread.
//   softmax: AttnRowState (online_softmax.cuh) per row; a thread owns 2 rows (g, g+8 of its warp's 16)
//          and 2 adjacent columns of every 8, so the row max and sum are quad shuffles (xor 1, 2),
//          as in the mma.sync kernel.
//   P V:   P rounded to T in registers is wgmma's register A fragment (the accumulator layout of S
//          and the A layout line up: columns 16kk..16kk+15 of S are A of k step kk); B = V from
//          shared memory, which is MN-major for this product (keys are the reduction dim, D is
//          contiguous): the descriptor's transpose bit (imm-trans-b = 1).
//   Epilogue: O / l staged in the (then free) Q tile, 16-byte row stores; lse = m + log l.
// Shared-memory layout of every tile (Q, K, V): the canonical 128-byte-swizzle layout, K-major for
// Q and K and MN-major for V, which for a row-major [row][D] tile is the same bytes: the head dim in
// 64-element (128-byte) column blocks, block b of an R-row tile at b·R·128 bytes, row r at r·128
// within it, and the 16-byte chunk c of that row stored at chunk c ^ (r % 8). Each 8-row, 1024-byte
// group is one swizzle atom; the hardware applies the XOR on address bits (4-6 ^= 7-9), so every tile
// starts 1024-byte aligned (the kernel aligns the dynamic shared memory base itself). Descriptors:
//   Q, K (K-major): start = tile + (kk / 4)·R·128 + (kk % 4)·32 for k step kk, SBO = 1024 (next 8
//     rows), LBO unused with a swizzle (1).
//   V (MN-major, N = D): start = tile + kk·16·128 (16 keys per k step), LBO = kBlockN·128 (next 64
//     head-dim columns), SBO = 1024 (next 8 keys).
// The 16-byte cp.async chunks and the epilogue's 4-byte stores are bank-conflict free under the XOR.
// Same semantics as the mma.sync kernel: bottom-right causal (key j visible from query i iff
// j <= i + causal_offset), key tiles past the CTA's last visible key never loaded, the mask evaluated
// only on tiles crossing the first row's limit or the end of the keys (descending tile order), GQA by
// index (kv head = h / group), ragged Nq / Nk, fully masked rows give output 0 and lse -inf, 64-bit
// offsets.
// tests/emulation/flash_fwd_sm90_emulator.cpp runs this file on the CPU with wgmma, its descriptors
// and fences, cp.async and the proxy fence emulated from the PTX ISA, against a float64 reference.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../../online_softmax.cuh"
#include "../device_common.cuh"
#include "../flash_fwd.cuh"
#include "wgmma.cuh"

namespace tiled_attn {
namespace flash_fwd_sm90 {

using flash_fwd::Params;

template <int kHeadDim_>
struct Traits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarpGroups = 2;
  static constexpr int kThreads = kWarpGroups * 128;
  static constexpr int kBlockM = 64 * kWarpGroups;
  // Keys per tile: 128 up to D = 128 (S and O accumulators 64 + 64 registers at D = 128), 64 at D = 256
  // (O alone takes 128 registers).
  static constexpr int kBlockN = kHeadDim <= 128 ? 128 : 64;
  static constexpr int kStages = 2;
  static constexpr int kTileD = kHeadDim;     // the shared tiles' width and P V's N (WsTraits pads it)
  static constexpr int kSRegs = kBlockN / 2;  // S accumulator registers per thread
  static constexpr int kORegs = kHeadDim / 2;  // O accumulator registers per thread
  static constexpr int kQKSteps = kHeadDim / 16;
  static constexpr int kPVSteps = kBlockN / 16;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;
  // + 1024: the dynamic shared memory base is aligned up to the swizzle atom inside the kernel.
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKVBytes + 1024;
  // Copies: consecutive threads take consecutive 16-byte chunks of a row (coalesced).
  static constexpr int kChunksPerRow = kHeadDim / 8;
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;

  static_assert(kHeadDim % 64 == 0, "whole 128-byte swizzle rows");
  static_assert(kThreads % kChunksPerRow == 0 && kRowsPerPass % 8 == 0,
                "a thread keeps its row % 8 (its chunk's swizzle) across passes");
  static_assert(kBlockN % kRowsPerPass == 0 && kBlockM % kRowsPerPass == 0, "whole passes");
  static_assert(kStages >= 2, "one tile in flight while one is computed");
};

using flash_fwd::clamp64;
using flash_fwd::pack2;

// Byte offset of 16-byte chunk `chunk` of row `row` in a kRows-row tile (the swizzled layout above).
template <int kRows>
__device__ __forceinline__ uint32_t swizzled_offset(int row, int chunk) {
  return static_cast<uint32_t>((chunk / 8) * kRows * 128 + row * 128 + (((chunk % 8) ^ (row % 8)) * 16));
}

// kRows x D of a row-major global tile into a swizzled shared tile. `dst` is this thread's first chunk
// (swizzled_offset of (cp_row, cp_chunk) added), `src` its global address; later passes are
// kRowsPerPass rows further, whose swizzle is the same (kRowsPerPass % 8 == 0). Rows at or past
// `rows_valid` (>= 1) are zero-filled from a clamped, never-read source address (the tile's row 0).
template <class Tr, int kRows, typename T>
__device__ __forceinline__ void load_tile(uint32_t dst, const T* src, int64_t stride, int row0, int rows_valid) {
#pragma unroll
  for (int i = 0; i < kRows / Tr::kRowsPerPass; ++i) {
    const bool valid = row0 + i * Tr::kRowsPerPass < rows_valid;
    cp_async_16(dst + i * Tr::kRowsPerPass * 128,
                src + (valid ? int64_t{i * Tr::kRowsPerPass} * stride : -int64_t{row0} * stride), valid);
  }
}
// The same for a tile whose rows all lie inside the tensor: no predicate.
template <class Tr, int kRows, typename T>
__device__ __forceinline__ void load_tile_full(uint32_t dst, const T* src, int64_t stride) {
  const int64_t step = int64_t{Tr::kRowsPerPass} * stride;
#pragma unroll
  for (int i = 0; i < kRows / Tr::kRowsPerPass; ++i) {
    cp_async_16_full(dst + i * Tr::kRowsPerPass * 128, src);
    src += step;
  }
}

// Mask (kMask), scale to log2 units, row max over the quad, AttnRowState rescale, p in place, Σp.
// Accumulator register i of S holds row g + 8·((i / 2) % 2) of the warp's 16, key
// key0 + 8·(i / 4) + i % 2 with key0 = n0 + 2t. `limit_base`: the (clamped) limit of row g.
template <bool kMask, class Tr>
__device__ __forceinline__ void softmax_tile(float (&s)[Tr::kSRegs], float (&alpha)[2], AttnRowState (&rs)[2],
                                             int limit_base, int seqlen_k, int key0, float scale_log2) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int limit = min(seqlen_k, limit_base + 8 * hh);
    float tile_max = -CUDART_INF_F;
#pragma unroll
    for (int j = 0; j < Tr::kBlockN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[4 * j + 2 * hh + e];
        x *= scale_log2;
        if constexpr (kMask) {
          if (key0 + 8 * j + e >= limit) x = -CUDART_INF_F;
        }
        tile_max = fmaxf(tile_max, x);
      }
    }
    tile_max = warp_allreduce_max<4>(tile_max);
    alpha[hh] = rs[hh].rescale(tile_max);
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < Tr::kBlockN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[4 * j + 2 * hh + e];
        x = rs[hh].p_ftz(x);
        sum += x;
      }
    }
    rs[hh].add(sum);
  }
}

// What a CTA computes, the same in both kernels: the query tile (the heaviest first: blockIdx.x counts
// the m blocks down), its (batch, head) and kv head (GQA by index), and the key tiles its rows see,
// walked in descending order so the ones the causal diagonal or the ragged end cut come first.
template <class Tr>
struct CtaTile {
  int bh, batch, head, head_kv, m0, rows_q;
  int n_tiles;       // key tiles the tile's last row sees
  int unmasked_end;  // keys below it are visible from every row of the tile (its first row's limit)

  __device__ __forceinline__ explicit CtaTile(const Params& p)
      : CtaTile(p, static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y)) {}
  // Query tile m_block of pair p.bh_offset + slot (the persistent ws kernel's scheduler picks both).
  __device__ __forceinline__ CtaTile(const Params& p, int m_block, int slot) {
    bh = p.bh_offset + slot;
    batch = bh / p.heads_q;
    head = bh - batch * p.heads_q;
    head_kv = head / p.group;
    m0 = m_block * Tr::kBlockM;
    rows_q = min(Tr::kBlockM, p.seqlen_q - m0);
    n_tiles = (row_limit(p, m0 + rows_q - 1) + Tr::kBlockN - 1) / Tr::kBlockN;
    unmasked_end = row_limit(p, m0);
  }
  // Query row i (of the sequence) sees keys [0, row_limit).
  static __device__ __forceinline__ int row_limit(const Params& p, int64_t i) {
    return p.causal ? static_cast<int>(clamp64(i + p.causal_offset + 1, 0, p.seqlen_k)) : p.seqlen_k;
  }
  __device__ __forceinline__ int key0(int it) const { return (n_tiles - 1 - it) * Tr::kBlockN; }
  // softmax_tile's limit_base for tile row `row`: its limit, clamped below at −kBlockM rather than 0
  // so that limit_base + 8 (the thread's second row) stays that row's own (negative: no key) limit.
  __device__ __forceinline__ int limit_base(const Params& p, int row) const {
    return p.causal ? static_cast<int>(clamp64(int64_t{m0} + row + p.causal_offset + 1, -Tr::kBlockM, p.seqlen_k))
                    : p.seqlen_k;
  }
  // softmax_tile of key tile `it`, masked only where a row's limit or the end of the keys cuts it.
  __device__ __forceinline__ void softmax(const Params& p, int it, float (&s)[Tr::kSRegs], float (&alpha)[2],
                                          AttnRowState (&rs)[2], int limit_base, int t) const {
    const int n0 = key0(it);
    if (n0 + Tr::kBlockN > unmasked_end) {
      softmax_tile<true, Tr>(s, alpha, rs, limit_base, p.seqlen_k, n0 + 2 * t, p.scale_log2);
    } else {
      softmax_tile<false, Tr>(s, alpha, rs, limit_base, p.seqlen_k, n0 + 2 * t, p.scale_log2);
    }
  }
};

// Adding (bytes >> 4) to the start-address field moves a descriptor (no carry out of the field:
// shared addresses are below 2^18).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// S = Q Kᵀ for one warpgroup's 64 rows x kBlockN keys: desc_q / desc_k at k step 0 of its Q rows and of
// the K slot (both K-major; k step kk is 32 bytes into the 128-byte rows of column block kk / 4).
template <class Tr, typename T>
__device__ __forceinline__ void qk_product(float (&s)[Tr::kSRegs], uint64_t desc_q, uint64_t desc_k) {
#pragma unroll
  for (int kk = 0; kk < Tr::kQKSteps; ++kk) {
    const uint32_t k_off = (kk % 4) * 32;
    Wgmma<Tr::kBlockN, T>::template ss<0>(s, desc_advance(desc_q, (kk / 4) * Tr::kBlockM * 128 + k_off),
                                         desc_advance(desc_k, (kk / 4) * Tr::kBlockN * 128 + k_off), kk > 0 ? 1 : 0);
  }
}

// P (S after softmax_tile) rounded to T as wgmma's register A fragments: k step kk (keys 16kk..16kk+15)
// is S's column chunks 2kk (registers 8kk..8kk+3) and 2kk + 1 (8kk+4..8kk+7).
template <class Tr, typename T>
__device__ __forceinline__ void pack_p(const float (&s)[Tr::kSRegs], uint32_t (&pa)[Tr::kPVSteps][4]) {
#pragma unroll
  for (int kk = 0; kk < Tr::kPVSteps; ++kk) {
    pa[kk][0] = pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
    pa[kk][1] = pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// O += P V: desc_v at the V slot (MN-major, 16 keys = 16 rows of 128 bytes a k step), N = the tile's
// whole width (kTileD: past D, zero columns).
template <class Tr, typename T>
__device__ __forceinline__ void pv_product(float (&acc)[Tr::kORegs], const uint32_t (&pa)[Tr::kPVSteps][4],
                                           uint64_t desc_v) {
#pragma unroll
  for (int kk = 0; kk < Tr::kPVSteps; ++kk)
    Wgmma<Tr::kTileD, T>::template rs<1>(acc, pa[kk], desc_advance(desc_v, kk * 16 * 128), 1);
}

// A row's end: l summed over the quad (each thread held its own columns' share); returns 1 / l (0 for
// a row with no visible key: output 0) and sets lse.
__device__ __forceinline__ float finish_row(AttnRowState& rs, float& lse) {
  rs.l = warp_allreduce_sum<4>(rs.l);
  return rs.finalize(lse);
}

// The epilogue's first half: this thread's two rows (row0, row0 + 8 of the tile) of O / l into the
// swizzled Q tile at sQ, and their lse (rows below rows_q) into lse_row. The caller orders these
// stores before the tile's read-back (a CTA barrier, or a __syncwarp where each warp reads its own
// rows).
template <class Tr, typename T>
__device__ __forceinline__ void stage_output(const float (&acc)[Tr::kORegs], AttnRowState (&rs)[2], uint32_t sQ,
                                             int row0, int t, int rows_q, float* lse_row) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float lse;
    const float inv_l = finish_row(rs[hh], lse);
    const int r = row0 + 8 * hh;
#pragma unroll
    for (int j = 0; j < Tr::kHeadDim / 8; ++j) {
      st_shared_b32(sQ + swizzled_offset<Tr::kBlockM>(r, j) + 4 * t,
                    pack2<T>(acc[4 * j + 2 * hh] * inv_l, acc[4 * j + 2 * hh + 1] * inv_l));
    }
    if (t == 0 && r < rows_q) lse_row[r] = lse;
  }
}

// A 4 x 4 transpose of 32-bit words across a quad (the four lanes of one row of the accumulator
// fragments, t = lane % 4): on entry lane t holds x[i] = M[t][i], on exit M[i][t]. Two butterfly
// stages (lane masks 1, 2), each swapping the off-diagonal halves with the partner lane t ^ m: per
// pair of words one shuffle, the lane's bit choosing which of the two it sends and overwrites.
__device__ __forceinline__ void transpose_quad(uint32_t (&x)[4], int t) {
#pragma unroll
  for (int m = 1; m <= 2; m *= 2) {
    const bool hi = (t & m) != 0;
#pragma unroll
    for (int i0 = 0; i0 < 4; ++i0) {
      if (i0 & m) continue;
      const int i1 = i0 | m;
      const uint32_t got = __shfl_xor_sync(0xffffffffu, hi ? x[i0] : x[i1], m);
      if (hi) x[i0] = got;
      else x[i1] = got;
    }
  }
}

// The whole epilogue without shared memory (the persistent ws kernel's: its Q tile may hold the next
// tile's Q by then): this thread's two rows of O / l straight into gO (the tile's first row; rows
// below rows_q), and lse. Lane t of a quad holds columns 8j + 2t, + 1 of every 8-column block j: as
// they are, two columns a 4-byte store (a warp's store: 8 rows x 16 bytes, half of each 32-byte
// sector, the other half written by the next block's store). kWide: the quad first trades them
// (transpose_quad over blocks 4q .. 4q + 3), so lane t holds block 4q + t whole, a 16-byte store (a
// warp's: 8 rows x 64 bytes, whole sectors) and a quarter of the store instructions.
template <class Tr, typename T, bool kWide = false>
__device__ __forceinline__ void store_output(const float (&acc)[Tr::kORegs], AttnRowState (&rs)[2], T* gO,
                                             int64_t o_seq, int row0, int t, int rows_q, float* lse_row) {
  static_assert(!kWide || Tr::kHeadDim % 32 == 0, "whole groups of four 8-column blocks");
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float lse;
    const float inv_l = finish_row(rs[hh], lse);
    const int r = row0 + 8 * hh;
    T* const o = gO + int64_t{r} * o_seq;
    if constexpr (kWide) {
      // Every lane of the quad takes part in the shuffles; only the store is per row.
#pragma unroll
      for (int q = 0; q < Tr::kHeadDim / 32; ++q) {
        uint32_t x[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = 4 * q + i;
          x[i] = pack2<T>(acc[4 * j + 2 * hh] * inv_l, acc[4 * j + 2 * hh + 1] * inv_l);
        }
        transpose_quad(x, t);
        if (r < rows_q) *reinterpret_cast<uint4*>(o + 8 * (4 * q + t)) = make_uint4(x[0], x[1], x[2], x[3]);
      }
    } else if (r < rows_q) {
#pragma unroll
      for (int j = 0; j < Tr::kHeadDim / 8; ++j) {
        *reinterpret_cast<uint32_t*>(o + 8 * j + 2 * t) =
            pack2<T>(acc[4 * j + 2 * hh] * inv_l, acc[4 * j + 2 * hh + 1] * inv_l);
      }
    }
    if (t == 0 && r < rows_q) lse_row[r] = lse;
  }
}

template <class Tr, typename T>
__global__ void __launch_bounds__(Tr::kThreads, 1) flash_fwd_sm90_kernel(const Params p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Every tile 1024-byte aligned (the swizzle atom; see the top of the file).
  const uint32_t sQ = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sK = sQ + Tr::kQBytes;                      // kStages slots of kKVBytes
  const uint32_t sV = sK + Tr::kStages * Tr::kKVBytes;       // kStages slots of kKVBytes

  const int tid = threadIdx.x;
  const int wg = tid / 128, warp = (tid % 128) / kWarpSize, lane = tid % kWarpSize;
  const int g = lane / 4, t = lane % 4;

  const CtaTile<Tr> cta(p);
  const int batch = cta.batch, head = cta.head, m0 = cta.m0, rows_q = cta.rows_q, n_tiles = cta.n_tiles;

  const T* const gQ = static_cast<const T*>(p.q) + int64_t{batch} * p.q_batch + int64_t{head} * p.q_head + int64_t{m0} * p.q_seq;
  const T* const gK = static_cast<const T*>(p.k) + int64_t{batch} * p.k_batch + int64_t{cta.head_kv} * p.k_head;
  const T* const gV = static_cast<const T*>(p.v) + int64_t{batch} * p.v_batch + int64_t{cta.head_kv} * p.v_head;

  // This thread's rows: m0 + row0 (hh = 0) and + 8 (hh = 1).
  const int row0 = wg * 64 + warp * 16 + g;
  const int limit_base = cta.limit_base(p, row0);

  // Copy map: this thread's row within a pass and 16-byte chunk within the row.
  const int cp_row = tid / Tr::kChunksPerRow, cp_chunk = tid % Tr::kChunksPerRow;
  auto load_kv = [&](uint32_t slot, const T* gbase, int64_t stride, int it) {
    const int n0 = cta.key0(it);
    const uint32_t dst = slot + swizzled_offset<Tr::kBlockN>(cp_row, cp_chunk);
    const T* src = gbase + int64_t{n0 + cp_row} * stride + cp_chunk * 8;
    if (n0 + Tr::kBlockN <= p.seqlen_k) load_tile_full<Tr, Tr::kBlockN>(dst, src, stride);
    else load_tile<Tr, Tr::kBlockN>(dst, src, stride, cp_row, p.seqlen_k - n0);
  };
  auto load_tile_kv = [&](int it) {
    const int slot = it % Tr::kStages;
    load_kv(sK + slot * Tr::kKVBytes, gK, p.k_seq, it);
    load_kv(sV + slot * Tr::kKVBytes, gV, p.v_seq, it);
  };

  float acc[Tr::kORegs];
#pragma unroll
  for (int i = 0; i < Tr::kORegs; ++i) acc[i] = 0.f;
  AttnRowState rs[2] = {AttnRowState::identity(), AttnRowState::identity()};

  // Commit groups: {Q, K_0, V_0}, {K_1, V_1}, ...: tile i is group i (committed even when empty).
  // Before iteration i's barrier kStages − 1 + i groups are committed and tile i must be complete:
  // at most kStages − 2 pending. After the barrier, tile i + kStages − 1 overwrites the slot of tile
  // i − 1, whose last readers (both warpgroups' wgmmas of iteration i − 1, waited for) are done.
  load_tile<Tr, Tr::kBlockM>(sQ + swizzled_offset<Tr::kBlockM>(cp_row, cp_chunk),
                             gQ + int64_t{cp_row} * p.q_seq + cp_chunk * 8, p.q_seq, cp_row, rows_q);
#pragma unroll
  for (int i = 0; i < Tr::kStages - 1; ++i) {
    if (i < n_tiles) load_tile_kv(i);
    cp_async_commit();
  }

  // Descriptors of this warpgroup's Q rows (k step 0) and of slot 0's K / V (k step 0).
  const uint64_t desc_q0 = make_desc_sw128(sQ + wg * 64 * 128, 16, 1024);
  const uint64_t desc_k0 = make_desc_sw128(sK, 16, 1024);
  const uint64_t desc_v0 = make_desc_sw128(sV, Tr::kBlockN * 128, 1024);

  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait<Tr::kStages - 2>();  // tile it (and Q with it at it = 0) has landed
    fence_proxy_async();               // ... and is visible to wgmma's async-proxy reads
    __syncthreads();
    if (it + Tr::kStages - 1 < n_tiles) load_tile_kv(it + Tr::kStages - 1);
    cp_async_commit();
    const int slot = it % Tr::kStages;

    // S = Q Kᵀ (this warpgroup's 64 rows x kBlockN keys).
    float s[Tr::kSRegs];
    wgmma_fence();
    qk_product<Tr, T>(s, desc_q0, desc_advance(desc_k0, slot * Tr::kKVBytes));
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(s);

    float alpha[2];
    cta.softmax(p, it, s, alpha, rs, limit_base, t);
#pragma unroll
    for (int i = 0; i < Tr::kORegs; ++i) acc[i] *= alpha[(i / 2) % 2];

    uint32_t pa[Tr::kPVSteps][4];
    pack_p<Tr, T>(s, pa);

    // O += P V.
    fence_operands(acc);
    fence_operands(pa);
    wgmma_fence();
    pv_product<Tr, T>(acc, pa, desc_advance(desc_v0, slot * Tr::kKVBytes));
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(acc);
  }

  // Epilogue. Drain the (empty, or with no key tile the Q) copy groups; every wgmma reading sQ has
  // been waited for, and the barrier orders them before the staging stores below.
  cp_async_wait<0>();
  __syncthreads();
  stage_output<Tr, T>(acc, rs, sQ, row0, t, rows_q, p.lse + int64_t{cta.bh} * p.seqlen_q + m0);
  __syncthreads();
  T* const gO = static_cast<T*>(p.out) + int64_t{batch} * p.o_batch + int64_t{head} * p.o_head +
                int64_t{m0 + cp_row} * p.o_seq + cp_chunk * 8;
  const uint32_t sO = sQ + swizzled_offset<Tr::kBlockM>(cp_row, cp_chunk);
#pragma unroll
  for (int i = 0; i < Tr::kBlockM / Tr::kRowsPerPass; ++i) {
    if (cp_row + i * Tr::kRowsPerPass < rows_q) {
      *reinterpret_cast<uint4*>(gO + int64_t{i * Tr::kRowsPerPass} * p.o_seq) =
          ld_shared_b128(sO + i * Tr::kRowsPerPass * 128);
    }
  }
}

}  // namespace flash_fwd_sm90
}  // namespace tiled_attn
