// launch_common.cuh: the host-side launch the attention forwards (flash_fwd_launch.cuh,
// sm90/flash_fwd_sm90_launch.cuh), the split-KV path and the sm90 backward share. The CPU emulators run the CTAs
// themselves (launch_sliced is not theirs), slicing the heads the same way.
#pragma once

#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

#include "flash_fwd.cuh"

namespace tiled_attn {
namespace flash_fwd {

// grid.y is limited to 65535 (B·Hq can pass it): launch in slices of heads, each with its bh_offset.
constexpr int kMaxGridY = 65535;

#ifndef TILED_ATTN_EMULATION
// `kernel` over grid (m_blocks, count, splits) with `count` (the (batch, head) pairs, or the (batch,
// kv head) slots of the split path and the sm90 backward) in slices of kMaxGridY. grid.x = query tiles
// (the backward's key tiles), fastest-varying: the CTAs resident together share one head's K/V (Q/dO)
// in L2. P: the kernel's parameters (a bh_offset field); `extra`: its further arguments (TMA maps).
template <typename Kernel, typename P, typename... Extra>
cudaError_t launch_sliced(Kernel kernel, int threads, int smem, unsigned m_blocks, int64_t count, unsigned splits,
                          P params, cudaStream_t stream, const Extra&... extra) {
  // Above 48 KB a kernel must opt in to its dynamic shared memory. Set on every call (a cheap host-side
  // attribute write) so a second device or context never runs without it.
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
  }
  for (int64_t first = 0; first < count; first += kMaxGridY) {
    params.bh_offset = static_cast<int>(first);
    const dim3 grid(m_blocks, static_cast<unsigned>(std::min<int64_t>(kMaxGridY, count - first)), splits);
    kernel<<<grid, threads, smem, stream>>>(params, extra...);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

#endif  // TILED_ATTN_EMULATION

}  // namespace flash_fwd
}  // namespace tiled_attn
