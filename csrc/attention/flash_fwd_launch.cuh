// flash_fwd_launch.cuh: the host launchers of flash_fwd_kernel. Included only by the
// flash_fwd_hdim*.cu files (one (head dim, dtype) instantiation each: the kernel is the slow part to
// build), by the sweep build (sweep/) and by the CPU emulator (which supplies launch_kernel).
#pragma once

#include <algorithm>
#include <type_traits>

#include "flash_fwd.cuh"
#include "flash_fwd_kernel.cuh"

namespace tiled_attn {
namespace flash_fwd {

// grid.y is limited to 65535 (B·Hq can pass it): launch in slices of heads, each with its bh_offset.
constexpr int kMaxGridY = 65535;

// One kernel (Traits, dtype) over all heads.
template <class Tr, typename T>
cudaError_t launch_kernel(Params params, int batch_heads, cudaStream_t stream)
#ifdef TILED_ATTN_EMULATION
    ;  // tests/emulation/flash_fwd_emulator.cpp runs the CTAs on the CPU
#else
{
  auto kernel = flash_fwd_kernel<Tr, T>;
  constexpr int kSmem = Tr::kSmemBytes;
  // Above 48 KB a kernel must opt in to its dynamic shared memory. Set on every call (a cheap host-side
  // attribute write) so a second device or context never runs without it.
  if (kSmem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) return err;
  }
  const unsigned m_blocks = static_cast<unsigned>((params.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM);
  // grid.x = query tiles, fastest-varying: the CTAs resident together share one head's K/V in L2.
  for (int64_t first = 0; first < batch_heads; first += kMaxGridY) {
    params.bh_offset = static_cast<int>(first);
    const dim3 grid(m_blocks, static_cast<unsigned>(std::min<int64_t>(kMaxGridY, batch_heads - first)));
    kernel<<<grid, Tr::kThreads, kSmem, stream>>>(params);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}
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

}  // namespace flash_fwd
}  // namespace tiled_attn
