// flash_fwd.cuh: what the dispatcher (flash_fwd.cu) and the per-head-dim instantiations
// (flash_fwd_hdim*.cu) share: the kernel's parameters, the tile configuration per head dim, and the
// launcher's declaration. No kernel code here, so flash_fwd.cu compiles in seconds.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace tiled_attn {
namespace flash_fwd {

// Everything the kernel reads, by value in the constant bank. Strides are in elements, the head dim
// is contiguous; every base offset is formed in 64 bits (a (B, N, H, D) tensor passes 2^31 elements
// at B·N·H·D = 32k·2048, the benchmark shape).
struct Params {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;  // (B, Hq, Nq) contiguous, natural log
  int64_t q_batch, q_head, q_seq;
  int64_t k_batch, k_head, k_seq;
  int64_t v_batch, v_head, v_seq;
  int64_t o_batch, o_head, o_seq;
  int64_t causal_offset;  // query i sees key j iff j <= i + causal_offset (clamped to [-Nq, Nk])
  int heads_q;
  int group;      // Hq / Hkv: query head h reads key/value head h / group
  int bh_offset;  // first (batch·Hq + head) of this launch (grid.y is capped at 65535)
  int seqlen_q, seqlen_k;
  float scale_log2;  // softmax scale · log2 e: scores go to log2 units with one multiply
  bool causal;
};

// Tile shape per head dim: FlashAttention-2's sm80/sm90 forward choices (flash_fwd_launch_template.h,
// non-dropout rows for A100/H100; reasons in its comments) where they compile without spills here:
// D = 96/128 take 128x64 at 4 warps (two CTAs per SM; 8 warps measured 28% slower there); D = 192
// takes 128x64 at 8 warps; D = 256 on H100 takes 64x64 at 4 warps so two CTAs fit in 228 KB.
// D = 32/64: FA2's 128x128 (a 128-float score tile per thread) spills in this kernel (ptxas, sm_90a,
// nvcc 13.0), so they take 128x64 with Q in registers (168 / 255 registers, no spill), which also
// reads less shared memory per mma (128 vs 144 bytes of ldmatrix at D = 64). None of this is
// measured on the H100 yet: the sweep that replaces these rows goes in benchmarks/.
//   kBlockM: query rows per CTA (resident), kBlockN: keys per pipeline tile, kWarps: each warp owns
//   kBlockM / kWarps query rows (16 or 32), kStages: K/V tile slots in shared memory (1 = FA2's
//   single K and single V buffer; 2 = the next tile's K and V load during this tile's math),
//   kQInRegs: the Q tile's mma fragments are loaded from shared memory once and kept in registers
//   (only where ptxas shows no spills; otherwise Q stays resident in shared memory and its fragments
//   are re-read per key tile, as FA2 does).
// Shared memory = (kBlockM + 2·kStages·kBlockN)·(D + 8)·2 bytes (rows padded by 8 halfs).
// Mirrored in tiled_attn/configs.py CUDA_ATTENTION (keep the two in step).
template <int kHeadDim>
struct TileConfig;
template <>
struct TileConfig<32> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 4, kStages = 2;
  static constexpr bool kQInRegs = true;
};
template <>
struct TileConfig<64> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 4, kStages = 2;
  static constexpr bool kQInRegs = true;
};
template <>
struct TileConfig<96> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 4, kStages = 2;
  static constexpr bool kQInRegs = false;
};
template <>
struct TileConfig<128> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 4, kStages = 2;
  static constexpr bool kQInRegs = false;
};
template <>
struct TileConfig<192> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 8, kStages = 2;
  static constexpr bool kQInRegs = false;
};
template <>
struct TileConfig<256> {
  static constexpr int kBlockM = 64, kBlockN = 64, kWarps = 4, kStages = 1;
  static constexpr bool kQInRegs = false;
};

// Launch the kernel for head dim D and element type T (__half or __nv_bfloat16) over
// `batch_heads` = B·Hq (query) heads. Defined in flash_fwd_launch.cuh, instantiated once per
// (D, T) in flash_fwd_hdim<D>.cu so the build compiles the head dims in parallel.
template <int kHeadDim, typename T>
cudaError_t run_flash_fwd(Params params, int batch_heads, cudaStream_t stream);

}  // namespace flash_fwd
}  // namespace tiled_attn
