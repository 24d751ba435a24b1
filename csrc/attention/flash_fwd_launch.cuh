// flash_fwd_launch.cuh: the host launcher of flash_fwd_kernel for one (head dim, dtype). Included
// only by the flash_fwd_hdim*.cu files, one instantiation each (the kernel is the slow part to build).
#pragma once

#include <algorithm>

#include "flash_fwd.cuh"
#include "flash_fwd_kernel.cuh"

namespace tiled_attn {
namespace flash_fwd {

// grid.y is limited to 65535 (B·Hq can pass it): launch in slices of heads, each with its bh_offset.
constexpr int kMaxGridY = 65535;

template <int kHeadDim, typename T>
cudaError_t run_flash_fwd(Params params, int batch_heads, cudaStream_t stream) {
  using Tr = Traits<kHeadDim, TileConfig<kHeadDim>>;
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

}  // namespace flash_fwd
}  // namespace tiled_attn
