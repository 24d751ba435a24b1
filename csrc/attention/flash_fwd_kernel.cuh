// flash_fwd_kernel.cuh: the fused attention forward tile kernel (FlashAttention-2's structure on
// mma.sync tensor cores, sm80+; H100 is the target).
//
// One CTA owns kBlockM query rows of one (batch, head) and streams the keys in kBlockN-row tiles:
//   Q tile:  global -> shared (cp.async) once, resident; its mma fragments are ldmatrix'ed from shared
//            memory per key tile, or once into registers where the register budget allows (kQRegs).
//   K, V:    global -> shared through a cp.async pipeline of K and V slots (16-byte copies, the
//            ragged last tile zero-filled past N; whole tiles unpredicated under kLean).
//   S = Q Kᵀ on mma.sync.m16n8k16 (fp16/bf16 in, fp32 accumulate); the row state and the accumulator
//   rescale go through AttnRowState (online_softmax.cuh): scores pre-multiplied by scale·log2 e and
//   p = exp2(s − m) (p_ftz), or under kFold the raw scores' max and p = exp2(s·c − m) as one FFMA
//   (p_raw_ftz); one SFU op per score either way;
//   P is converted to fp16/bf16 in registers and reused as the A operand of O += P V (its C fragment
//   layout is the A fragment layout, FA2's trick: no shared-memory round trip); V's B fragments come
//   from ldmatrix.trans.
//   Epilogue: O / l staged through the (free) Q tile in shared memory, then 16-byte row stores;
//   lse = m + log l in natural units.
// Schedules (flash_fwd.cuh, flag::): FA2's (two barriers per tile, K and V in separate groups),
// kJoint (one barrier per tile), kSkew (two warp groups half an iteration apart). The flags and tile
// shapes are compile-time (Cfg); benchmarks/sweep_cuda_attention.py times them against each other.
// Causal (key j visible from query i iff j <= i + causal_offset): key tiles past the CTA's last
// visible key are never loaded (loop bound), under kSkew a warp skips the math of tiles past its own
// last row's limit, and the mask is evaluated only on tiles that cross the CTA's first row's limit or
// the end of the keys (descending tile order puts them first).
//
// Fragment layouts used below (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point
// type"; g = lane / 4 (groupID), t = lane % 4 (threadID_in_group); each .b32 register holds two
// 16-bit elements, the lower column / k index in the low half):
//   A (16x16, row-major):   a[0] = (row g,   k 2t..2t+1)      a[1] = (row g+8, k 2t..2t+1)
//                           a[2] = (row g,   k 2t+8..2t+9)    a[3] = (row g+8, k 2t+8..2t+9)
//   B (16x8, k x n):        b[0] = (k 2t..2t+1,   col g)      b[1] = (k 2t+8..2t+9, col g)
//   C/D (16x8, fp32):       c[0], c[1] = (row g,   cols 2t, 2t+1)
//                           c[2], c[3] = (row g+8, cols 2t, 2t+1)
// ldmatrix.m8n8.x4.b16: lane l supplies the address of row l % 8 of matrix l / 8 (16 contiguous
// bytes); register i of lane l receives matrix i's row l / 4, columns 2(l%4), 2(l%4)+1. With .trans
// it receives matrix i's column l / 4, rows 2(l%4), 2(l%4)+1 (the stored rows become the k index).
// tests/emulation/flash_fwd_emulator.cpp implements these tables independently and runs this file's
// kernel on the CPU against a float64 reference.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../online_softmax.cuh"
#include "device_common.cuh"
#include "flash_fwd.cuh"

namespace tiled_attn {
namespace flash_fwd {

template <int kHeadDim_, class Cfg>
struct Traits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = Cfg::kBlockM;
  static constexpr int kBlockN = Cfg::kBlockN;
  static constexpr int kWarps = Cfg::kWarps;
  static constexpr int kStages = Cfg::kStages;
  static constexpr unsigned kFlags = Cfg::kFlags;
  static constexpr int kMinBlocks = Cfg::kMinBlocks;
  static constexpr bool kQInRegs = (kFlags & flag::kQRegs) != 0;
  static constexpr bool kFold = (kFlags & flag::kFold) != 0;
  static constexpr bool kLean = (kFlags & flag::kLean) != 0;
  static constexpr bool kLazy = (kFlags & flag::kLazy) != 0;
  static constexpr bool kSkew = (kFlags & flag::kSkew) != 0;
  static constexpr bool kJoint = kSkew || (kFlags & flag::kJoint) != 0;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kWarpRows = kBlockM / kWarps;  // query rows per warp
  static constexpr int kMTiles = kWarpRows / 16;      // m16 row tiles per warp
  static constexpr int kNTiles = kBlockN / 8;         // n8 tiles of S (keys)
  static constexpr int kDTiles = kHeadDim / 8;        // n8 tiles of O (head dim)
  static constexpr int kQKSteps = kHeadDim / 16;      // k16 steps of Q Kᵀ
  static constexpr int kPVSteps = kBlockN / 16;       // k16 steps of P V
  // kJoint: tiles in flight ahead of the one being computed. K_{i+P} overwrites K_{i+P−kKSlots}, read
  // last in iteration i + P − kKSlots (< i: kKSlots >= P + 1). Under kSkew V_t is read in iterations
  // t and t + 1, hence one V slot more.
  static constexpr int kPrefetch = kStages - 1;
  static constexpr int kKSlots = kStages;
  static constexpr int kVSlots = kStages + (kSkew ? 1 : 0);
  // Shared-memory rows padded by 8 elements (16 bytes): the 8 row addresses of one ldmatrix phase,
  // (2D + 16)·r bytes apart, then fall in 8 distinct 16-byte bank groups for every D % 16 == 0
  // (2D/16 + 1 is odd), so ldmatrix, the 16-byte cp.async stores (8 threads cover one row's 128 bytes)
  // and the 4-byte epilogue stores are conflict-free without a swizzle. The padding costs 16/(2D) of
  // the tile (6% at D = 128), which moves no config here across a CTAs-per-SM boundary.
  static constexpr int kLd = kHeadDim + 8;
  static constexpr int kQElems = kBlockM * kLd;
  static constexpr int kKVElems = kBlockN * kLd;
  static constexpr int kSmemBytes = (kQElems + (kKSlots + kVSlots) * kKVElems) * 2;
  // Q fragments kept in registers: [m tile][k step][4], or a placeholder when Q is re-read from smem.
  static constexpr int kQFragM = kQInRegs ? kMTiles : 1;
  static constexpr int kQFragK = kQInRegs ? kQKSteps : 1;

  static_assert(kHeadDim % 16 == 0, "head dim in k16 steps");
  static_assert(kBlockN % 16 == 0, "key tile in k16 steps (P's A fragments pair two n8 tiles)");
  static_assert(kWarpRows % 16 == 0 && kWarpRows * kWarps == kBlockM, "whole m16 tiles per warp");
  static_assert(kStages >= 1, "at least one K and one V slot");
  static_assert(!kJoint || kStages >= 2, "kJoint prefetches kStages - 1 >= 1 tiles");
  static_assert(!kSkew || kWarps % 2 == 0, "kSkew splits the warps in two equal groups");
};

// ---------------------------------------------------------------------------------------------
// The PTX this kernel needs beyond device_common.cuh's, one wrapper each. The host emulator defines
// the same names itself.
// ---------------------------------------------------------------------------------------------
#ifndef TILED_ATTN_EMULATION
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a·b on one m16n8k16 tile (fp32 accumulate). Not volatile: a pure register op the compiler may
// schedule freely between the ldmatrix loads.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same<T, __half>::value) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same<T, __nv_bfloat16>::value, "fp16 or bf16");
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Plain shared-memory accesses of the epilogue, wrapped only so the emulator can check them for races.
__device__ __forceinline__ void st_shared_b32(void* p, uint32_t v) { *static_cast<uint32_t*>(p) = v; }
__device__ __forceinline__ uint4 ld_shared_b128(const void* p) { return *static_cast<const uint4*>(p); }
#endif  // TILED_ATTN_EMULATION

// Which 16-byte chunks of a kRows x D tile this thread copies: kThreadsPerRow threads share a row
// (consecutive threads on consecutive chunks: coalesced), each taking every kThreadsPerRow-th chunk
// of it, and the CTA covers kRowsPerPass rows per pass. Every chunk of one thread then sits at a
// compile-time offset from its first, so a tile copy costs one base address and no per-chunk index
// math held in registers. kThreadsPerRow is the whole row where the thread count allows, else the
// largest power of two dividing it (D = 96: 4 of 12 chunks, D = 192: 8 of 24).
template <class Tr>
struct ChunkMap {
  static constexpr int kChunksPerRow = Tr::kHeadDim / 8;
  static constexpr int kThreadsPerRow =
      Tr::kThreads % kChunksPerRow == 0 ? kChunksPerRow : (kChunksPerRow & -kChunksPerRow);
  static constexpr int kChunksPerThread = kChunksPerRow / kThreadsPerRow;  // per row
  static constexpr int kRowsPerPass = Tr::kThreads / kThreadsPerRow;
  static_assert(Tr::kThreads % kThreadsPerRow == 0 && Tr::kBlockN % kRowsPerPass == 0 &&
                    Tr::kBlockM % kRowsPerPass == 0,
                "every thread copies the same number of chunks");
  static __device__ __forceinline__ int row(int tid) { return tid / kThreadsPerRow; }
  static __device__ __forceinline__ int col(int tid) { return (tid % kThreadsPerRow) * 8; }
};

// kRows x D elements of a row-major global tile into a padded shared tile with 16-byte cp.async.
// `smem` and `gmem` already point at this thread's first chunk (ChunkMap row/col); `row0` is that
// chunk's row, `stride` the global row stride. Rows at or past `rows_valid` (>= 1) are zero-filled;
// their source address is clamped to the tile's first row (never read: src-size 0).
template <class Tr, int kRows, typename T>
__device__ __forceinline__ void load_tile(T* smem, const T* gmem, int64_t stride, int row0, int rows_valid) {
  using Map = ChunkMap<Tr>;
#pragma unroll
  for (int i = 0; i < kRows / Map::kRowsPerPass; ++i) {
    const bool valid = row0 + i * Map::kRowsPerPass < rows_valid;
    const T* src = gmem + (valid ? int64_t{i * Map::kRowsPerPass} * stride : -int64_t{row0} * stride);
#pragma unroll
    for (int j = 0; j < Map::kChunksPerThread; ++j) {
      cp_async_16(smem_u32(smem + i * Map::kRowsPerPass * Tr::kLd + j * Map::kThreadsPerRow * 8),
                  src + j * Map::kThreadsPerRow * 8, valid);
    }
  }
}

// The same for a tile whose kRows rows all lie inside the tensor (kLean): no predicate, no clamp, and
// each row's source one 64-bit add (of the CTA-uniform kRowsPerPass·stride) past the previous one.
template <class Tr, int kRows, typename T>
__device__ __forceinline__ void load_tile_full(T* smem, const T* gmem, int64_t stride) {
  using Map = ChunkMap<Tr>;
  const int64_t step = int64_t{Map::kRowsPerPass} * stride;
#pragma unroll
  for (int i = 0; i < kRows / Map::kRowsPerPass; ++i) {
#pragma unroll
    for (int j = 0; j < Map::kChunksPerThread; ++j) {
      cp_async_16_full(smem_u32(smem + i * Map::kRowsPerPass * Tr::kLd + j * Map::kThreadsPerRow * 8),
                       gmem + j * Map::kThreadsPerRow * 8);
    }
    gmem += step;
  }
}

// S = Q Kᵀ for this warp's rows against one key tile. `q_lane` / `k_lane`: this lane's ldmatrix
// address (bytes, shared space) for m tile 0 / key 0, k step 0.
template <class Tr, typename T>
__device__ __forceinline__ void gemm_qk(float (&s)[Tr::kMTiles][Tr::kNTiles][4],
                                        const uint32_t (&qf)[Tr::kQFragM][Tr::kQFragK][4], uint32_t q_lane,
                                        uint32_t k_lane) {
#pragma unroll
  for (int mi = 0; mi < Tr::kMTiles; ++mi)
#pragma unroll
    for (int ni = 0; ni < Tr::kNTiles; ++ni)
#pragma unroll
      for (int r = 0; r < 4; ++r) s[mi][ni][r] = 0.f;
#pragma unroll
  for (int kk = 0; kk < Tr::kQKSteps; ++kk) {
    uint32_t a[Tr::kMTiles][4];
#pragma unroll
    for (int mi = 0; mi < Tr::kMTiles; ++mi) {
      if constexpr (Tr::kQInRegs) {
#pragma unroll
        for (int r = 0; r < 4; ++r) a[mi][r] = qf[mi][kk][r];
      } else {
        ldmatrix_x4(a[mi], q_lane + (mi * 16 * Tr::kLd + kk * 16) * 2);
      }
    }
#pragma unroll
    for (int np = 0; np < Tr::kNTiles / 2; ++np) {
      // b[0], b[1]: key n-tile 2np; b[2], b[3]: key n-tile 2np + 1 (see k_lane in the kernel).
      uint32_t b[4];
      ldmatrix_x4(b, k_lane + (np * 16 * Tr::kLd + kk * 16) * 2);
#pragma unroll
      for (int mi = 0; mi < Tr::kMTiles; ++mi) {
        mma_16816<T>(s[mi][2 * np], a[mi], b[0], b[1]);
        mma_16816<T>(s[mi][2 * np + 1], a[mi], b[2], b[3]);
      }
    }
  }
}

// Mask (kMask), then per row: tile max over the quad that shares the row, the AttnRowState rescale
// of l and of this row's accumulator, p in place, Σp into l. Without kFold the scores go to log2
// units first (one multiply each) and p = exp2(s − m); with kFold the max is taken on the raw scores
// and p = exp2(s·c − m) in one FFMA (the launcher guarantees c = scale·log2 e > 0).
// This thread holds, of m tile mi, rows g (hh = 0) and g + 8 (hh = 1), at key columns
// key0 + 8·ni + e (e = 0, 1) with key0 = n0 + 2t. Row (mi, hh) sees keys below row_limit(mi, hh).
template <bool kMask, class Tr, class RowLimit>
__device__ __forceinline__ void softmax_tile_rows(float (&s)[Tr::kMTiles][Tr::kNTiles][4],
                                                  float (&acc)[Tr::kMTiles][Tr::kDTiles][4],
                                                  AttnRowState (&rs)[Tr::kMTiles][2], const RowLimit& row_limit,
                                                  int key0, float scale_log2) {
  float alpha[Tr::kMTiles][2];
#pragma unroll
  for (int mi = 0; mi < Tr::kMTiles; ++mi) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int limit = row_limit(mi, hh);
      float tile_max = -CUDART_INF_F;
#pragma unroll
      for (int ni = 0; ni < Tr::kNTiles; ++ni) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[mi][ni][2 * hh + e];
          if constexpr (!Tr::kFold) x *= scale_log2;
          if constexpr (kMask) {
            if (key0 + ni * 8 + e >= limit) x = -CUDART_INF_F;
          }
          tile_max = fmaxf(tile_max, x);
        }
      }
      tile_max = warp_allreduce_max<4>(tile_max);
      alpha[mi][hh] = Tr::kFold ? rs[mi][hh].rescale_raw(tile_max, scale_log2) : rs[mi][hh].rescale(tile_max);
      float sum = 0.f;
#pragma unroll
      for (int ni = 0; ni < Tr::kNTiles; ++ni) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[mi][ni][2 * hh + e];
          x = Tr::kFold ? rs[mi][hh].p_raw_ftz(x, scale_log2) : rs[mi][hh].p_ftz(x);
          sum += x;
        }
      }
      rs[mi][hh].add(sum);
    }
  }
  // kLazy: one vote per warp; the branch is warp-uniform.
  bool moved = true;
  if constexpr (Tr::kLazy) {
    bool any = false;
#pragma unroll
    for (int mi = 0; mi < Tr::kMTiles; ++mi) any |= (alpha[mi][0] != 1.f) | (alpha[mi][1] != 1.f);
    moved = __any_sync(0xffffffffu, any);
  }
  if (moved) {
#pragma unroll
    for (int mi = 0; mi < Tr::kMTiles; ++mi) {
#pragma unroll
      for (int dn = 0; dn < Tr::kDTiles; ++dn) {
        acc[mi][dn][0] *= alpha[mi][0];
        acc[mi][dn][1] *= alpha[mi][0];
        acc[mi][dn][2] *= alpha[mi][1];
        acc[mi][dn][3] *= alpha[mi][1];
      }
    }
  }
}

// The forward's rows: row (mi, hh) sees keys below min(Nk, limit_base + 16·mi + 8·hh) (see limit_base
// in the kernel).
template <bool kMask, class Tr>
__device__ __forceinline__ void softmax_tile(float (&s)[Tr::kMTiles][Tr::kNTiles][4],
                                             float (&acc)[Tr::kMTiles][Tr::kDTiles][4],
                                             AttnRowState (&rs)[Tr::kMTiles][2], int limit_base, int seqlen_k,
                                             int key0, float scale_log2) {
  softmax_tile_rows<kMask, Tr>(
      s, acc, rs, [&](int mi, int hh) { return min(seqlen_k, limit_base + mi * 16 + hh * 8); }, key0, scale_log2);
}

// P (the probabilities in place of the scores) rounded to T and packed as the A fragments of P V.
// P's C fragments of key n-tiles 2kk and 2kk+1 are exactly the A fragment of k step kk (a[0] = rows g,
// keys 2t..: c[0..1] of tile 2kk; a[1] = rows g+8: c[2..3] of 2kk; a[2], a[3]: the same of tile
// 2kk+1), so P never leaves registers; packed, it takes half the registers of the scores.
template <class Tr, typename T>
__device__ __forceinline__ void pack_p(uint32_t (&pa)[Tr::kMTiles][Tr::kPVSteps][4],
                                       const float (&s)[Tr::kMTiles][Tr::kNTiles][4]) {
#pragma unroll
  for (int mi = 0; mi < Tr::kMTiles; ++mi) {
#pragma unroll
    for (int kk = 0; kk < Tr::kPVSteps; ++kk) {
      pa[mi][kk][0] = pack2<T>(s[mi][2 * kk][0], s[mi][2 * kk][1]);
      pa[mi][kk][1] = pack2<T>(s[mi][2 * kk][2], s[mi][2 * kk][3]);
      pa[mi][kk][2] = pack2<T>(s[mi][2 * kk + 1][0], s[mi][2 * kk + 1][1]);
      pa[mi][kk][3] = pack2<T>(s[mi][2 * kk + 1][2], s[mi][2 * kk + 1][3]);
    }
  }
}

// O += P V for one key tile; V's B fragments from ldmatrix.trans.
template <class Tr, typename T>
__device__ __forceinline__ void gemm_pv(float (&acc)[Tr::kMTiles][Tr::kDTiles][4],
                                        const uint32_t (&pa)[Tr::kMTiles][Tr::kPVSteps][4], uint32_t v_lane) {
#pragma unroll
  for (int kk = 0; kk < Tr::kPVSteps; ++kk) {
#pragma unroll
    for (int dp = 0; dp < Tr::kHeadDim / 16; ++dp) {
      // b[0], b[1]: head-dim n-tile 2dp; b[2], b[3]: n-tile 2dp + 1 (see v_lane in the kernel).
      uint32_t b[4];
      ldmatrix_x4_trans(b, v_lane + (kk * 16 * Tr::kLd + dp * 16) * 2);
#pragma unroll
      for (int mi = 0; mi < Tr::kMTiles; ++mi) {
        mma_16816<T>(acc[mi][2 * dp], pa[mi][kk], b[0], b[1]);
        mma_16816<T>(acc[mi][2 * dp + 1], pa[mi][kk], b[2], b[3]);
      }
    }
  }
}

// kSplit = false: the forward (grid: query tiles x (batch, query head)). kSplit = true: split-KV
// (flash-decoding; grid: packed-row tiles x (batch, kv head) slots x key splits): the rows of a slot
// are the (query, query head) pairs of its GQA group, row r = query r / group of query head
// kv head·group + r % group (query-major, so row limits still grow with r), the CTA walks the keys of
// its split only, and the epilogue writes the unnormalized partial state (Params::partial) instead of
// out and lse. Everything that differs is behind `kSplit`: the forward's instantiation is the code it
// was before the split existed.
template <class Tr, typename T, bool kSplit = false>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks) flash_fwd_kernel(const Params p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* const sQ = reinterpret_cast<T*>(smem_raw);
  T* const sK = sQ + Tr::kQElems;                  // kKSlots slots of kKVElems
  T* const sV = sK + Tr::kKSlots * Tr::kKVElems;   // kVSlots slots of kKVElems

  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int g = lane / 4, t = lane % 4;  // PTX's groupID and threadID_in_group

  // Heaviest causal query tiles first (they see the most keys), so the last wave is short ones.
  const int m_block = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  // 32-bit index math (B·Hq < 2^31, checked on the host): CTA-uniform, cheap, and it keeps the 64-bit
  // products below out of the registers the key loop needs.
  // bh: (batch, query head), or under kSplit the (batch, kv head) slot; `head` is then the group's
  // first query head.
  const int bh = p.bh_offset + static_cast<int>(blockIdx.y);
  const int heads = kSplit ? p.heads_q / p.group : p.heads_q;
  const int batch = bh / heads, slot = bh - batch * heads;
  const int head = kSplit ? slot * p.group : slot;
  const int head_kv = kSplit ? slot : head / p.group;  // GQA/MQA by index: k/v are never repeated
  const int m0 = m_block * Tr::kBlockM;
  const int n_rows = kSplit ? p.seqlen_q * p.group : p.seqlen_q;  // rows of this (batch, head) or slot
  const int rows_q = min(Tr::kBlockM, n_rows - m0);

  // Under kSplit: the slot's first query head, query 0 (its rows are gathered below).
  const T* const gQ = static_cast<const T*>(p.q) + int64_t{batch} * p.q_batch + int64_t{head} * p.q_head +
                      (kSplit ? 0 : m0) * p.q_seq;
  const T* const gK = static_cast<const T*>(p.k) + int64_t{batch} * p.k_batch + int64_t{head_kv} * p.k_head;
  const T* const gV = static_cast<const T*>(p.v) + int64_t{batch} * p.v_batch + int64_t{head_kv} * p.v_head;

  // Row i sees keys j < limit(i): min(Nk, i + offset + 1) under the causal mask (none below 0), i
  // the query of the row (under kSplit, packed row r is query r / group).
  auto row_limit = [&](int64_t i) -> int {
    if constexpr (kSplit) i /= p.group;
    return p.causal ? static_cast<int>(clamp64(i + p.causal_offset + 1, 0, p.seqlen_k)) : p.seqlen_k;
  };
  // Key tiles past the last row's limit are never loaded. Under kSplit the CTA's keys are
  // [kv_lo, kv_end): its split's range (kv_lo a multiple of kBlockN) cut at that limit, empty for a
  // split no row of the CTA sees (n_tiles = 0: the identity state is written).
  int kv_lo = 0, kv_end = row_limit(m0 + rows_q - 1);
  if constexpr (kSplit) {
    const int64_t lo = int64_t{blockIdx.z} * p.split_len;
    kv_lo = static_cast<int>(lo < p.seqlen_k ? lo : p.seqlen_k);
    kv_end = static_cast<int>(clamp64(lo + p.split_len, kv_lo, kv_end > kv_lo ? kv_end : kv_lo));
  }
  const int n_tiles = (kv_end - kv_lo + Tr::kBlockN - 1) / Tr::kBlockN;

  // The CTA's first row has the smallest limit, so a tile ending at or before unmasked_end needs no
  // mask for any of its rows. (A per-warp bound would mask fewer tiles, but it is a per-thread
  // register where this one is uniform, and that register makes D = 128 spill.)
  const int unmasked_end = row_limit(m0);
  // This warp's rows are m0 + warp_row0 .. + kWarpRows − 1. Tiles at or past warp_kv_end (its last
  // real row's limit) are invisible to all of them: under kSkew the warp skips their math (not their
  // barriers; see visible() below).
  const int warp_row0 = warp * Tr::kWarpRows;
  const int warp_kv_end = warp_row0 < rows_q ? row_limit(m0 + min(warp_row0 + Tr::kWarpRows, rows_q) - 1) : 0;
  // This thread's rows are m0 + warp_row0 + g + 16·mi + 8·hh. Their limits are min(Nk, limit_base +
  // 16·mi + 8·hh), with limit_base the limit of row m0 + warp_row0 + g before the min, clamped to
  // [-kBlockM, Nk]: one register instead of one per row. The clamp is exact: below -kBlockM every row
  // of the warp has a negative limit (sees nothing) either way, above Nk the min gives Nk either way.
  const int limit_base =
      p.causal ? static_cast<int>(clamp64(int64_t{m0} + warp_row0 + g + p.causal_offset + 1, -Tr::kBlockM, p.seqlen_k))
               : p.seqlen_k;
  // Under kSplit a packed row's limit is not affine in the row: each of this thread's rows keeps its
  // own (2·kMTiles registers; one at kBlockM = 16).
  int packed_limit[kSplit ? Tr::kMTiles : 1][2];
  if constexpr (kSplit) {
#pragma unroll
    for (int mi = 0; mi < Tr::kMTiles; ++mi)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) packed_limit[mi][hh] = row_limit(int64_t{m0} + warp_row0 + g + mi * 16 + hh * 8);
  }

  // Tiles run from the last (iteration 0) to the first, so the masked ones come first. Tile `it`
  // lives in K slot it % kKSlots and V slot it % kVSlots.
  auto tile_key0 = [&](int it) { return kv_lo + (n_tiles - 1 - it) * Tr::kBlockN; };
  // This thread's first copy chunk (ChunkMap). The K/V source rows are formed per tile from the
  // CTA-uniform gK / gV (uniform registers) rather than kept as per-thread 64-bit pointers: the key
  // loop is register-bound at D = 128 (255 of 255).
  const int cp_row = ChunkMap<Tr>::row(tid), cp_col = ChunkMap<Tr>::col(tid);
  const int cp_smem = cp_row * Tr::kLd + cp_col;
  auto load_kv = [&](T* slot, const T* gbase, int64_t stride, int it) {
    const int n0 = tile_key0(it);
    if (Tr::kLean && n0 + Tr::kBlockN <= p.seqlen_k) {
      load_tile_full<Tr, Tr::kBlockN>(slot + cp_smem, gbase + int64_t{n0} * stride + (int64_t{cp_row} * stride + cp_col),
                                      stride);
    } else {
      load_tile<Tr, Tr::kBlockN>(slot + cp_smem, gbase + int64_t{n0 + cp_row} * stride + cp_col, stride, cp_row,
                                 p.seqlen_k - n0);
    }
  };
  auto load_k = [&](int it) { load_kv(sK + (it % Tr::kKSlots) * Tr::kKVElems, gK, p.k_seq, it); };
  auto load_v = [&](int it) { load_kv(sV + (it % Tr::kVSlots) * Tr::kKVElems, gV, p.v_seq, it); };

  // This lane's ldmatrix row addresses (see the tables at the top of the file).
  //  A from Q (row-major, rows r0.., k0..): matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7),
  //    (rows 0-7, k 8-15), (rows 8-15, k 8-15) are a[0..3], so lane l points at row l % 16, col 8·(l / 16).
  //  B from K (key-major, which is B's n-major "col" layout): matrices (keys 0-7, k 0-7), (keys 0-7,
  //    k 8-15), (keys 8-15, k 0-7), (keys 8-15, k 8-15) are b[0], b[1] of key n-tile 0 and b[0], b[1] of
  //    n-tile 1, so lane l points at key l % 8 + 8·(l / 16), col 8·((l / 8) % 2).
  //  B from V with .trans (key-major; B's k index is the key): matrices (keys 0-7, d 0-7), (keys 8-15,
  //    d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 8-15) are b[0], b[1] of d n-tile 0 and of d n-tile 1, so
  //    lane l points at key l % 16, col 8·(l / 16): the same map as A.
  const int a_off = (lane % 16) * Tr::kLd + (lane / 16) * 8;
  const int k_off = (lane % 8 + (lane / 16) * 8) * Tr::kLd + ((lane / 8) % 2) * 8;
  const uint32_t q_lane = smem_u32(sQ) + (warp_row0 * Tr::kLd + a_off) * 2;
  const uint32_t k_lane0 = smem_u32(sK) + k_off * 2;
  const uint32_t v_lane0 = smem_u32(sV) + a_off * 2;

  float acc[Tr::kMTiles][Tr::kDTiles][4];
#pragma unroll
  for (int mi = 0; mi < Tr::kMTiles; ++mi)
#pragma unroll
    for (int dn = 0; dn < Tr::kDTiles; ++dn)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[mi][dn][r] = 0.f;
  AttnRowState rs[Tr::kMTiles][2];
#pragma unroll
  for (int mi = 0; mi < Tr::kMTiles; ++mi) rs[mi][0] = rs[mi][1] = AttnRowState::identity();
  uint32_t qf[Tr::kQFragM][Tr::kQFragK][4];
  using Scores = float[Tr::kMTiles][Tr::kNTiles][4];      // scores, then P, of one tile
  using PFrags = uint32_t[Tr::kMTiles][Tr::kPVSteps][4];  // P packed as P V's A fragments

  // Once the first tile's group (which holds Q) has landed and a barrier has passed.
  auto load_q_frags = [&]() {
    if constexpr (Tr::kQInRegs) {
#pragma unroll
      for (int mi = 0; mi < Tr::kMTiles; ++mi)
#pragma unroll
        for (int kk = 0; kk < Tr::kQKSteps; ++kk) ldmatrix_x4(qf[mi][kk], q_lane + (mi * 16 * Tr::kLd + kk * 16) * 2);
    }
  };
  // The per-warp skip only where it pays: the 256-row kSkew tiles (a 128-row CTA skips ~3% of its
  // causal work, and the extra register makes D = 128 spill under kJoint).
  // Under kSplit a warp whose rows are all past the packed rows (a decode tile of several warps)
  // skips the math too: only its share of the copies and the barriers remain.
  auto visible = [&](int it) { return (!Tr::kSkew && !kSplit) || tile_key0(it) < warp_kv_end; };
  // The softmax of a tile under kSplit (the forward's is written out at its two call sites).
  auto softmax_packed = [&](Scores& s, int n0) {
    if constexpr (kSplit) {
      auto limit_of = [&](int mi, int hh) { return packed_limit[mi][hh]; };
      if (n0 + Tr::kBlockN > unmasked_end) {
        softmax_tile_rows<true, Tr>(s, acc, rs, limit_of, n0 + 2 * t, p.scale_log2);
      } else {
        softmax_tile_rows<false, Tr>(s, acc, rs, limit_of, n0 + 2 * t, p.scale_log2);
      }
    }
  };
  // Q Kᵀ of tile it into s, then its softmax (masked where the tile needs it) into P fragments.
  auto qk_softmax = [&](PFrags& pa, int it) {
    Scores s;
    gemm_qk<Tr, T>(s, qf, q_lane, k_lane0 + (it % Tr::kKSlots) * Tr::kKVElems * 2);
    const int n0 = tile_key0(it);
    if constexpr (kSplit) {
      softmax_packed(s, n0);
    } else if (n0 + Tr::kBlockN > unmasked_end) {
      softmax_tile<true, Tr>(s, acc, rs, limit_base, p.seqlen_k, n0 + 2 * t, p.scale_log2);
    } else {
      softmax_tile<false, Tr>(s, acc, rs, limit_base, p.seqlen_k, n0 + 2 * t, p.scale_log2);
    }
    pack_p<Tr, T>(pa, s);
  };
  auto pv = [&](const PFrags& pa, int it) { gemm_pv<Tr, T>(acc, pa, v_lane0 + (it % Tr::kVSlots) * Tr::kKVElems * 2); };

  if constexpr (kSplit) {
    // Packed rows are not evenly spaced in q (query and head both vary): one source per row, formed
    // once per CTA. Rows past the packed rows are zero-filled from the slot's first row.
    using Map = ChunkMap<Tr>;
#pragma unroll
    for (int i = 0; i < Tr::kBlockM / Map::kRowsPerPass; ++i) {
      const int r = cp_row + i * Map::kRowsPerPass;
      const bool valid = r < rows_q;
      const int qi = (m0 + r) / p.group, hq = m0 + r - qi * p.group;
      const T* src = gQ + (valid ? int64_t{hq} * p.q_head + int64_t{qi} * p.q_seq : int64_t{0}) + cp_col;
#pragma unroll
      for (int j = 0; j < Map::kChunksPerThread; ++j) {
        cp_async_16(smem_u32(sQ + cp_smem + i * Map::kRowsPerPass * Tr::kLd + j * Map::kThreadsPerRow * 8),
                    src + j * Map::kThreadsPerRow * 8, valid);
      }
    }
  } else {
    load_tile<Tr, Tr::kBlockM>(sQ + cp_smem, gQ + cp_row * p.q_seq + cp_col, p.q_seq, cp_row, rows_q);
  }
  if constexpr (Tr::kJoint) {
    // Commit groups, in order: {Q, K_0, V_0}, {K_1, V_1}, ...: tile i is group i (a group is committed
    // even when empty, which keeps the count uniform). The prologue issues tiles 0..P−1 (P =
    // kPrefetch), iteration i issues tile i + P after its barrier, so before that barrier P + i groups
    // are committed and tile i (group i) must be complete: at most P − 1 pending. Slot reuse: tile
    // i + P overwrites tile i + P − kKSlots's K and i + P − kVSlots's V, whose last readers (iteration
    // i − 1 at the latest, see Traits) every warp finished before this barrier.
    // kSkew: between the barriers of iterations i and i + 1, group 0 computes Q Kᵀ_i, softmax_i,
    // P V_i; group 1 P V_{i−1} (its P stays in registers across the barrier, packed: 32 registers at
    // kBlockN = 64), then Q Kᵀ_i and softmax_i, and P V of the last tile after the loop. Per SM
    // sub-partition (warps w and w + kWarps/2) the phases pair as (Q Kᵀ, P V), (softmax, Q Kᵀ),
    // (P V, softmax): two of three put one warp's exponentials under the other's mma.
    const int group = Tr::kSkew ? warp / (Tr::kWarps / 2) : 0;
    PFrags pa;  // group 1: tile it − 1's P, carried across the barrier
    if (n_tiles > 0) {
      load_k(0);
      load_v(0);
    }
    cp_async_commit();
#pragma unroll
    for (int i = 1; i < Tr::kPrefetch; ++i) {
      if (i < n_tiles) {
        load_k(i);
        load_v(i);
      }
      cp_async_commit();
    }
    for (int it = 0; it < n_tiles; ++it) {
      cp_async_wait<Tr::kPrefetch - 1>();  // tile it has landed (and Q with it at it = 0)
      __syncthreads();
      if (it == 0) load_q_frags();
      auto prefetch = [&]() {
        if (it + Tr::kPrefetch < n_tiles) {
          load_k(it + Tr::kPrefetch);
          load_v(it + Tr::kPrefetch);
        }
        cp_async_commit();
      };
      if (group == 0) {
        prefetch();
        if (visible(it)) {
          qk_softmax(pa, it);
          pv(pa, it);
        }
      } else {
        // Group 1 issues its share of the copies once its carried P is consumed (P plus the copy
        // addresses would be its peak register pressure). Any point between the barriers is safe.
        if (it > 0 && visible(it - 1)) pv(pa, it - 1);
        prefetch();
        if (visible(it)) qk_softmax(pa, it);
      }
    }
    if (group == 1 && n_tiles > 0 && visible(n_tiles - 1)) pv(pa, n_tiles - 1);
  } else {
    // Commit groups, in order: {Q, K_0}, V_0, K_1, V_1, ..., so K_i is group 2i and V_i group 2i + 1
    // (a group is committed even when it is empty, which keeps the count uniform). The prologue issues
    // K_0..K_{S-1} and V_0..V_{S-2} (S = kStages: 2S − 1 groups); iteration i then issues V_{i+S-1}
    // after its first barrier and K_{i+S} after its second. Before Q Kᵀ of tile i, 2S − 1 + 2i groups
    // are committed and K_i (group 2i) must be complete: at most 2S − 2 pending. Before P V, 2S + 2i
    // are committed and V_i (2i + 1) must be complete: again 2S − 2. Slot reuse: V_{i+S-1} overwrites
    // V slot (i−1) % S, read last by P V of tile i−1, which every warp finished before the first
    // barrier of iteration i; K_{i+S} overwrites K slot i % S after the second barrier, which follows
    // Q Kᵀ of tile i in every warp. With S = 1 this is FA2's schedule (V_i loads during Q Kᵀ_i,
    // K_{i+1} during softmax and P V of tile i).
    static_assert(Tr::kKSlots == Tr::kStages && Tr::kVSlots == Tr::kStages, "one K and one V slot per stage");
    if (n_tiles > 0) load_k(0);
    cp_async_commit();
#pragma unroll
    for (int i = 0; i + 1 < Tr::kStages; ++i) {
      if (i < n_tiles) load_v(i);
      cp_async_commit();
      if (i + 1 < n_tiles) load_k(i + 1);
      cp_async_commit();
    }
    for (int it = 0; it < n_tiles; ++it) {
      cp_async_wait<2 * Tr::kStages - 2>();  // K_it has landed (and Q with it at it = 0)
      __syncthreads();
      if (it == 0) load_q_frags();
      if (it + Tr::kStages - 1 < n_tiles) load_v(it + Tr::kStages - 1);
      cp_async_commit();
      // No per-warp skip here (visible()): with the scores live across the second barrier, the
      // branches cost D = 128 64 bytes of spills (ptxas, sm_90a, nvcc 13.0); it saves ~3% of the
      // causal work at kBlockM = 128 and matters for the 256-row kSkew tiles.
      Scores s;
      gemm_qk<Tr, T>(s, qf, q_lane, k_lane0 + (it % Tr::kKSlots) * Tr::kKVElems * 2);
      cp_async_wait<2 * Tr::kStages - 2>();  // V_it has landed
      __syncthreads();
      if (it + Tr::kStages < n_tiles) load_k(it + Tr::kStages);
      cp_async_commit();
      const int n0 = tile_key0(it);
      if constexpr (kSplit) {
        softmax_packed(s, n0);
      } else if (n0 + Tr::kBlockN > unmasked_end) {
        softmax_tile<true, Tr>(s, acc, rs, limit_base, p.seqlen_k, n0 + 2 * t, p.scale_log2);
      } else {
        softmax_tile<false, Tr>(s, acc, rs, limit_base, p.seqlen_k, n0 + 2 * t, p.scale_log2);
      }
      PFrags pa;
      pack_p<Tr, T>(pa, s);
      pv(pa, it);
    }
  }

  // Epilogue. Drain the (empty, or with no key tile the Q) copy groups and let every warp finish
  // reading sQ before it is reused as the output staging tile.
  cp_async_wait<0>();
  __syncthreads();
  if constexpr (kSplit) {
    // The partial state of each packed row: acc unnormalized (this thread's 2 columns of every n8
    // tile, 8-byte stores: a row's quad writes 32 contiguous bytes per tile), m (log2 units) and the
    // row's l. A split the row does not see stores the identity (acc 0, m -inf, l 0).
    float* const part_m = p.partial + p.num_parts * Tr::kHeadDim;
    float* const part_l = part_m + p.num_parts;
#pragma unroll
    for (int mi = 0; mi < Tr::kMTiles; ++mi) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        rs[mi][hh].l = warp_allreduce_sum<4>(rs[mi][hh].l);  // l was this thread's columns only
        const int r = warp_row0 + mi * 16 + g + 8 * hh;
        if (r < rows_q) {
          const int qi = (m0 + r) / p.group, hq = head + (m0 + r - qi * p.group);
          const int64_t part =
              ((int64_t{batch} * p.heads_q + hq) * p.seqlen_q + qi) * p.num_splits + static_cast<int>(blockIdx.z);
          float* const dst = p.partial + part * Tr::kHeadDim + 2 * t;
#pragma unroll
          for (int dn = 0; dn < Tr::kDTiles; ++dn) {
            *reinterpret_cast<float2*>(dst + dn * 8) = make_float2(acc[mi][dn][2 * hh], acc[mi][dn][2 * hh + 1]);
          }
          if (t == 0) {
            part_m[part] = rs[mi][hh].m;
            part_l[part] = rs[mi][hh].l;
          }
        }
      }
    }
    return;
  }
  T* const sO = sQ;
  float* const lse_row = p.lse + int64_t{bh} * p.seqlen_q + m0;
#pragma unroll
  for (int mi = 0; mi < Tr::kMTiles; ++mi) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      rs[mi][hh].l = warp_allreduce_sum<4>(rs[mi][hh].l);  // l was this thread's columns only
      float lse;
      const float inv_l = rs[mi][hh].finalize(lse);  // 0 for a row with no visible key: output 0
      const int r = warp_row0 + mi * 16 + g + 8 * hh;
#pragma unroll
      for (int dn = 0; dn < Tr::kDTiles; ++dn) {
        st_shared_b32(sO + r * Tr::kLd + dn * 8 + 2 * t,
                      pack2<T>(acc[mi][dn][2 * hh] * inv_l, acc[mi][dn][2 * hh + 1] * inv_l));
      }
      if (t == 0 && r < rows_q) lse_row[r] = lse;
    }
  }
  __syncthreads();
  // 16-byte row stores of the rows this CTA owns, with the copy-in chunk map.
  using Map = ChunkMap<Tr>;
  T* const gO_thread = static_cast<T*>(p.out) + int64_t{batch} * p.o_batch + int64_t{head} * p.o_head +
                          (m0 + cp_row) * p.o_seq + cp_col;
#pragma unroll
  for (int i = 0; i < Tr::kBlockM / Map::kRowsPerPass; ++i) {
    if (cp_row + i * Map::kRowsPerPass < rows_q) {
#pragma unroll
      for (int j = 0; j < Map::kChunksPerThread; ++j) {
        *reinterpret_cast<uint4*>(gO_thread + int64_t{i * Map::kRowsPerPass} * p.o_seq + j * Map::kThreadsPerRow * 8) =
            ld_shared_b128(sO + cp_smem + i * Map::kRowsPerPass * Tr::kLd + j * Map::kThreadsPerRow * 8);
      }
    }
  }
}

}  // namespace flash_fwd
}  // namespace tiled_attn
