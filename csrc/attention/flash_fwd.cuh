// flash_fwd.cuh: what the dispatcher (flash_fwd.cu), the per-head-dim instantiations
// (flash_fwd_hdim*.cu) and the sweep build (sweep/) share: the kernel's parameters, the kernel
// configuration (a Cfg type: tile shape, warps, stages, schedule flags), the default Cfg per head dim,
// the host-side argument checks, and the launchers' declarations. No kernel code here, so
// flash_fwd.cu compiles in seconds.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../online_softmax.cuh"
#include "attention.h"

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
  // Split-KV (flash_fwd_kernel<Tr, T, true>, set by make_split_params; unused otherwise). A CTA owns
  // the packed rows of one (batch, kv head) slot (row r: query r / group of query head
  // kv head·group + r % group, so K/V are read once per GQA group) and keys
  // [split·split_len, (split + 1)·split_len), and writes the rows' unnormalized partial state to
  // `partial` (float32): acc [parts, D], then m [parts] (log2 units), then l [parts], with
  // parts = B·Hq·Nq·num_splits and part (flat row (b·Hq + h)·Nq + i)·num_splits + split. The merge
  // kernel (attention_merge.cu) folds a row's partials into out and lse.
  float* partial;
  int64_t num_parts;  // B·Hq·Nq·num_splits
  int num_splits;
  int split_len;  // a multiple of the kernel's kBlockN (the launcher sets it)
};

// ---------------------------------------------------------------------------------------------
// Kernel configuration. Cfg<kBlockM, kBlockN, kWarps, kStages, kFlags, kMinBlocks = 1>:
//   kBlockM: query rows per CTA (resident), kBlockN: keys per pipeline tile, kWarps: each warp owns
//   kBlockM / kWarps query rows (16 or 32), kStages: K tile slots in shared memory (and V slots; one
//   more V slot under flag::kSkew), kFlags: an OR of the flags below, kMinBlocks: CTAs per SM the
//   register allocation must allow (__launch_bounds__' second argument; 1 = no cap: ptxas then takes
//   up to 255 registers wherever it finds a use for them, e.g. 255 at D = 64 where ~170 suffice for
//   three CTAs per SM).
// Shared memory = (kBlockM + (K slots + V slots)·kBlockN)·(D + 8)·2 bytes (rows padded by 8 halfs).
// ---------------------------------------------------------------------------------------------
namespace flag {
// Q's mma fragments ldmatrix'ed once into registers instead of once per key tile (saves a sixth of
// the shared-memory reads at D = 64; only where ptxas shows no spills).
constexpr unsigned kQRegs = 1;
// The softmax scale folded into the exponential: the row max is taken on the raw scores and
// p = exp2(s·c − m) is one FFMA + one MUFU (FA2's scale_apply_exp2), one FMUL per score fewer than
// scaling every score first. Valid for c > 0 only: the launcher runs the same Cfg without this flag
// for scale <= 0 (or NaN).
constexpr unsigned kFold = 2;
// Key tiles that lie wholly inside N are copied with unpredicated cp.async from addresses formed by
// 64-bit adds off a per-tile base, instead of a clamp + select + 64-bit multiply per row (~11
// integer instructions per row, 88 per K or V tile per thread at D = 128, all between a barrier and
// the next mma). The one ragged tile keeps the predicated, zero-filling copy.
constexpr unsigned kLean = 4;
// One barrier per key tile: K_i and V_i travel in one commit group, kStages − 1 tiles ahead
// (CUTLASS's multistage mainloop; needs kStages >= 2). Without it: FA2's schedule, K and V in
// separate groups and two barriers per tile (V_i lands during Q Kᵀ_i, K_{i+kStages} during P V_i).
constexpr unsigned kJoint = 8;
// kJoint, and the warps split in two groups run a third of an iteration apart: between two barriers
// group 0 does Q Kᵀ_i, softmax_i, P V_i while group 1 does P V_{i−1} (its P carried across the
// barrier in registers), Q Kᵀ_i, softmax_i. Warps w and w + kWarps/2 share an SM sub-partition (warp
// scheduler), so in two of the three phases one of them runs its exponentials under the other's mma
// (FA3's ping-pong, enforced here by the program order instead of named barriers); with 2 CTAs/SM
// today that pairing is left to chance. One more V slot: V_{i−1} is still read in iteration i.
constexpr unsigned kSkew = 16;
// The accumulator rescale (kMTiles·kDTiles·4 FMULs per thread per tile, 128 at D = 128) is skipped
// when no row of the warp moved its max in this tile (alpha == 1 for all of them: one vote). Exact:
// a max that did not move gives alpha = exp2f(+0), which the CUDA Math API specifies as exactly 1
// (AttnRowState::rescale uses exp2f, not the ex2.approx intrinsic), and a multiply by 1 changes
// nothing. After the first few tiles of a long row the max rarely moves.
constexpr unsigned kLazy = 32;
}  // namespace flag

template <int kBlockM_, int kBlockN_, int kWarps_, int kStages_, unsigned kFlags_, int kMinBlocks_ = 1>
struct Cfg {
  static constexpr int kBlockM = kBlockM_, kBlockN = kBlockN_, kWarps = kWarps_, kStages = kStages_;
  static constexpr unsigned kFlags = kFlags_;
  static constexpr int kMinBlocks = kMinBlocks_;
};

// Tile configuration per head dim (TileConfig<D>::type) and, where it differs, per head dim for
// causal launches (TileConfig<D, true>::type; by default the non-causal row). The rows started from
// FlashAttention-2's sm80/sm90 forward choices (flash_fwd_launch_template.h) and are chosen by
// benchmarks/sweep_cuda_attention.py on the H100 (its output names the row to paste here).
// Mirrored in tiled_attn/configs.py CUDA_ATTENTION (keep the two in step; a test checks).
//   D = 32/64: FA2's 128x128 (a 128-float score tile per thread) spills in this kernel (ptxas,
//   sm_90a, nvcc 13.0); 128x64 with Q in registers does not (255 registers: two CTAs per SM; capped
//   at 168 for three, kMinBlocks = 3, it spills 200+ bytes).
//   D = 96/128: 128x64 at 4 warps, two CTAs per SM (255 registers). D = 192: 128x64 at 8 warps.
//   D = 256: 64x64 at 4 warps, one stage, so two CTAs fit in 228 KB (FA2's H100 row).
template <int kHeadDim, bool kCausal = false>
struct TileConfig : TileConfig<kHeadDim, false> {};
template <>
struct TileConfig<32> { using type = Cfg<128, 64, 4, 2, flag::kQRegs>; };
template <>
struct TileConfig<64> { using type = Cfg<128, 64, 4, 2, flag::kQRegs | flag::kFold | flag::kLean>; };
template <>
struct TileConfig<96> { using type = Cfg<128, 64, 4, 2, 0>; };
template <>
struct TileConfig<128> { using type = Cfg<128, 64, 4, 2, flag::kFold | flag::kLean>; };
template <>
struct TileConfig<192> { using type = Cfg<128, 64, 8, 2, 0>; };
template <>
struct TileConfig<256> { using type = Cfg<64, 64, 4, 1, 0>; };

// The split-KV (decode) tile per head dim: DecodeConfig<D>::type, run by flash_fwd_kernel<Tr, T, true>.
// A decode step has Nq·group packed rows per (batch, kv head), 4 at Nq = 1 and GQA 32/8: one warp's
// m16 tile holds them, so the CTA is one warp (a 128-row tile would do 32x the mma work for the same
// bytes, and sit at the tensor pipe's ridge instead of far below it). kJoint with two stages: one K+V
// tile in flight per CTA while the previous one is computed; smem (16 + 4·kBlockN)·(D + 8)·2 bytes =
// 72 KiB at D = 128, three CTAs (three warps, three 32 KiB K+V tiles in flight) per SM. Not yet measured on
// the H100. Mirrored in tiled_attn/configs.py CUDA_ATTENTION ("decode", "any", "*", D) (a test checks).
template <int kHeadDim>
struct DecodeConfig { using type = Cfg<16, 64, 1, 2, flag::kQRegs | flag::kFold | flag::kLean | flag::kJoint>; };
template <>
struct DecodeConfig<256> { using type = Cfg<16, 32, 1, 2, flag::kFold | flag::kLean | flag::kJoint>; };

// Launch the kernel for head dim D and element type T (__half or __nv_bfloat16) over
// `batch_heads` = B·Hq (query) heads with TileConfig<D> (TileConfig<D, true> when params.causal).
// Defined in flash_fwd_launch.cuh, instantiated once per (D, T) in flash_fwd_hdim<D>.cu so the build
// compiles the head dims in parallel.
template <int kHeadDim, typename T>
cudaError_t run_flash_fwd(Params params, int batch_heads, cudaStream_t stream);

// The split-KV launch: DecodeConfig<D> over `slots` = B·Hkv (batch, kv head) pairs, num_splits key
// ranges each (params from make_split_params), writing params.partial. Defined in
// flash_fwd_launch.cuh, instantiated next to run_flash_fwd in flash_fwd_hdim<D>.cu.
template <int kHeadDim, typename T>
cudaError_t run_flash_fwd_split(Params params, int slots, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// Host-side checks and Params, shared by attention_fwd (flash_fwd.cu) and the sweep entry
// (sweep/flash_fwd_sweep_entry.cu). Returns cudaErrorInvalidValue / cudaErrorMisalignedAddress for
// what the kernel cannot take, else cudaSuccess with `batch_heads` = B·Hq (0: nothing to launch).
// ---------------------------------------------------------------------------------------------
inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }
// 16-byte cp.async / stores need every row start 16-byte aligned: strides in multiples of 8 elements
// (the stride of a dim of size 1 is never multiplied by a nonzero index, so any value is fine there).
inline bool strides_ok(const AttnStrides& s, int64_t batch, int64_t heads, int64_t seqlen) {
  return (batch <= 1 || s.batch % 8 == 0) && (heads <= 1 || s.head % 8 == 0) && (seqlen <= 1 || s.seq % 8 == 0);
}

// The causal offset as the kernels take it: beyond [-Nq, Nk] it changes nothing (every row sees all
// keys, or none), and clamped there i + offset + 1 cannot overflow in a kernel.
inline int64_t clamp_causal_offset(int64_t offset, int64_t seqlen_q, int64_t seqlen_k) {
  return offset < -seqlen_q ? -seqlen_q : (offset > seqlen_k ? seqlen_k : offset);
}

inline cudaError_t make_params(const void* q, const void* k, const void* v, void* out, float* lse, int64_t batch,
                               int64_t heads_q, int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k,
                               AttnStrides q_stride, AttnStrides k_stride, AttnStrides v_stride,
                               AttnStrides o_stride, float scale, bool causal, int64_t causal_offset, Params& p,
                               int& batch_heads) {
  batch_heads = 0;
  if (batch < 0 || heads_q < 0 || heads_kv <= 0 || heads_q % heads_kv != 0) return cudaErrorInvalidValue;
  if (heads_q > 0 && batch > INT_MAX / heads_q) return cudaErrorInvalidValue;  // (batch, head) index is an int
  // Sequence positions are ints inside the kernel (every offset built from them is 64-bit).
  if (seqlen_q < 0 || seqlen_k < 0 || seqlen_q > INT_MAX - 256 || seqlen_k > INT_MAX - 256) {
    return cudaErrorInvalidValue;
  }
  if (batch == 0 || heads_q == 0 || seqlen_q == 0) return cudaSuccess;  // nothing to write
  if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(out) ||
      !strides_ok(q_stride, batch, heads_q, seqlen_q) || !strides_ok(k_stride, batch, heads_kv, seqlen_k) ||
      !strides_ok(v_stride, batch, heads_kv, seqlen_k) || !strides_ok(o_stride, batch, heads_q, seqlen_q)) {
    return cudaErrorMisalignedAddress;
  }
  p = Params{};
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.lse = lse;
  p.q_batch = q_stride.batch, p.q_head = q_stride.head, p.q_seq = q_stride.seq;
  p.k_batch = k_stride.batch, p.k_head = k_stride.head, p.k_seq = k_stride.seq;
  p.v_batch = v_stride.batch, p.v_head = v_stride.head, p.v_seq = v_stride.seq;
  p.o_batch = o_stride.batch, p.o_head = o_stride.head, p.o_seq = o_stride.seq;
  p.heads_q = static_cast<int>(heads_q);
  p.group = static_cast<int>(heads_q / heads_kv);
  p.bh_offset = 0;
  p.causal_offset = clamp_causal_offset(causal_offset, seqlen_q, seqlen_k);
  p.seqlen_q = static_cast<int>(seqlen_q);
  p.seqlen_k = static_cast<int>(seqlen_k);
  p.scale_log2 = scale * kLog2e;
  p.causal = causal;
  batch_heads = static_cast<int>(batch * heads_q);
  return cudaSuccess;
}

// The entry points' common path (flash_fwd.cu, sm90/flash_fwd_sm90.cu: HeadDims<...>::run): checks,
// Params, and the dispatch from the runtime dtype and head dim to the templates' compile-time T and D;
// cudaErrorInvalidValue where no instantiation matches.
template <typename T>
struct Elem {
  using type = T;
};

inline bool dtype_supported(AttnDtype dtype) {
  return dtype == AttnDtype::kFloat16 || dtype == AttnDtype::kBFloat16;
}

template <int... kDims>
struct HeadDims {
  static constexpr bool contains(int64_t d) { return ((d == kDims) || ...); }
  // launch(Elem<T>{}, std::integral_constant<int, D>{}) for `dtype`'s T and the D equal to `d`.
  template <typename Launch>
  static cudaError_t dispatch(AttnDtype dtype, int64_t d, Launch&& launch) {
    cudaError_t err = cudaErrorInvalidValue;
    auto for_elem = [&](auto elem) {
      (void)((d == kDims && ((err = launch(elem, std::integral_constant<int, kDims>{})), true)) || ...);
    };
    if (dtype == AttnDtype::kFloat16) for_elem(Elem<__half>{});
    if (dtype == AttnDtype::kBFloat16) for_elem(Elem<__nv_bfloat16>{});
    return err;
  }
  // An entry point's whole path: the dtype and head-dim check, Params from make_params(args..., p,
  // batch_heads), no launch when there is nothing to compute, else dispatch to
  // launch(Elem<T>{}, std::integral_constant<int, D>{}, p, batch_heads).
  template <typename Launch, typename... Args>
  static cudaError_t run(AttnDtype dtype, int64_t d, Launch&& launch, const Args&... args) {
    if (!contains(d) || !dtype_supported(dtype)) return cudaErrorInvalidValue;
    Params p;
    int batch_heads;
    const cudaError_t err = make_params(args..., p, batch_heads);
    if (err != cudaSuccess || batch_heads == 0) return err;
    return dispatch(dtype, d, [&](auto elem, auto dim) { return launch(elem, dim, p, batch_heads); });
  }
};

// What flash_fwd_hdim<D>.cu instantiate (tiled_attn/cuda/attention.py HEAD_DIMS mirrors it).
using FwdHeadDims = HeadDims<32, 64, 96, 128, 192, 256>;

// The split-KV Params on top of make_params' (which `p` must already hold, with batch_heads > 0):
// `partial` a 16-byte aligned float32 workspace of B·Hq·Nq·num_splits·(D + 2) floats
// (attention_split_workspace_floats), `slots` = B·Hkv. The packed row index and the row limits are
// ints: Nq·group + Nk must stay below INT_MAX.
inline cudaError_t make_split_params(float* partial, int64_t num_splits, int64_t batch, int64_t heads_kv, Params& p,
                                     int& slots) {
  slots = 0;
  if (partial == nullptr || num_splits < 1 || num_splits > 65535) return cudaErrorInvalidValue;  // grid.z
  if (!aligned16(partial)) return cudaErrorMisalignedAddress;
  if (int64_t{p.seqlen_q} * p.group + p.seqlen_k > INT_MAX - 256) return cudaErrorInvalidValue;
  if (batch > INT_MAX / heads_kv) return cudaErrorInvalidValue;
  p.partial = partial;
  p.num_parts = batch * p.heads_q * int64_t{p.seqlen_q} * num_splits;
  p.num_splits = static_cast<int>(num_splits);
  p.split_len = 0;
  slots = static_cast<int>(batch * heads_kv);
  return cudaSuccess;
}

}  // namespace flash_fwd
}  // namespace tiled_attn
