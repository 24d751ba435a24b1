// flash_fwd_launch.cuh: the host launchers of flash_fwd_kernel. Included only by the
// flash_fwd_hdim*.cu files (one (head dim, dtype) instantiation each: the kernel is the slow part to
// build), by the sweep build (sweep/) and by the CPU emulator (which supplies launch_kernel).
#pragma once

#include <algorithm>
#include <type_traits>

#include "flash_fwd.cuh"
#include "flash_fwd_kernel.cuh"
#include "launch_common.cuh"

namespace tiled_attn {
namespace flash_fwd {

#ifndef TILED_ATTN_EMULATION
// The emulator (tests/emulation/flash_fwd_emulator.cpp) supplies these two and runs the CTAs on the CPU.
template <class Tr, typename T>
cudaError_t launch_kernel(Params params, int batch_heads, cudaStream_t stream) {
  const unsigned m_blocks = static_cast<unsigned>((params.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM);
  return launch_sliced(flash_fwd_kernel<Tr, T>, Tr::kThreads, Tr::kSmemBytes, m_blocks, batch_heads, 1, params,
                       stream);
}

// The split-KV kernel (flash_fwd_kernel<Tr, T, true>) over `slots` (batch, kv head) pairs: grid.x the
// packed-row tiles (Nq·group rows), grid.y the slots, grid.z the key splits.
template <class Tr, typename T>
cudaError_t launch_split_kernel(Params params, int slots, cudaStream_t stream) {
  const unsigned m_blocks = static_cast<unsigned>((params.seqlen_q * params.group + Tr::kBlockM - 1) / Tr::kBlockM);
  return launch_sliced(flash_fwd_kernel<Tr, T, true>, Tr::kThreads, Tr::kSmemBytes, m_blocks, slots,
                       static_cast<unsigned>(params.num_splits), params, stream);
}
#else
template <class Tr, typename T>
cudaError_t launch_kernel(Params params, int batch_heads, cudaStream_t stream);
template <class Tr, typename T>
cudaError_t launch_split_kernel(Params params, int slots, cudaStream_t stream);
#endif

// The same configuration without flag::kFold: what a scale <= 0 (or NaN) runs, since max(c·s) is
// c·max(s) only for c > 0.
template <class C>
using WithoutFold = Cfg<C::kBlockM, C::kBlockN, C::kWarps, C::kStages, C::kFlags & ~flag::kFold, C::kMinBlocks>;

// One configuration: its kFold kernel for scale > 0, else the same tile without the fold.
template <int kHeadDim, class C, typename T>
cudaError_t run_flash_fwd_cfg(const Params& params, int batch_heads, cudaStream_t stream) {
  if constexpr ((C::kFlags & flag::kFold) != 0) {
    if (!(params.scale_log2 > 0.f)) return launch_kernel<Traits<kHeadDim, WithoutFold<C>>, T>(params, batch_heads, stream);
  }
  return launch_kernel<Traits<kHeadDim, C>, T>(params, batch_heads, stream);
}

template <int kHeadDim, typename T>
cudaError_t run_flash_fwd(Params params, int batch_heads, cudaStream_t stream) {
  using Plain = typename TileConfig<kHeadDim, false>::type;
  using Causal = typename TileConfig<kHeadDim, true>::type;
  if constexpr (!std::is_same<Plain, Causal>::value) {
    if (params.causal) return run_flash_fwd_cfg<kHeadDim, Causal, T>(params, batch_heads, stream);
  }
  return run_flash_fwd_cfg<kHeadDim, Plain, T>(params, batch_heads, stream);
}

// Keys per split: the keys any row can see (all of them, or up to the last query's causal limit)
// over num_splits, rounded up to whole kBlockN tiles (so only a split's last tile can be ragged or
// cut by the mask). Splits past the end are empty and write the identity state; the Python planner
// (tiled_attn/cuda/attention.py split_plan) picks counts that leave none empty.
template <int kBlockN>
int split_len_for(const Params& p) {
  const int64_t last_limit = std::max<int64_t>(int64_t{p.seqlen_q} + p.causal_offset, 0);  // query Nq − 1's
  const int64_t seen = p.causal ? std::min<int64_t>(last_limit, p.seqlen_k) : p.seqlen_k;
  const int64_t per_split = (seen + p.num_splits - 1) / p.num_splits;
  const int64_t len = (per_split + kBlockN - 1) / kBlockN * kBlockN;
  return static_cast<int>(len < kBlockN ? kBlockN : len);
}

template <int kHeadDim, class C, typename T>
cudaError_t run_flash_fwd_split_cfg(Params params, int slots, cudaStream_t stream) {
  params.split_len = split_len_for<C::kBlockN>(params);
  if constexpr ((C::kFlags & flag::kFold) != 0) {
    if (!(params.scale_log2 > 0.f)) {
      return launch_split_kernel<Traits<kHeadDim, WithoutFold<C>>, T>(params, slots, stream);
    }
  }
  return launch_split_kernel<Traits<kHeadDim, C>, T>(params, slots, stream);
}

template <int kHeadDim, typename T>
cudaError_t run_flash_fwd_split(Params params, int slots, cudaStream_t stream) {
  return run_flash_fwd_split_cfg<kHeadDim, typename DecodeConfig<kHeadDim>::type, T>(params, slots, stream);
}

}  // namespace flash_fwd
}  // namespace tiled_attn
