// flash_fwd_sm90_launch.cuh: the host launcher of flash_fwd_sm90_kernel. Included only by the
// flash_fwd_sm90_hdim*.cu files (one head dim each, both dtypes) and by the CPU emulator (which
// supplies launch_kernel).
#pragma once

#include "../launch_common.cuh"
#include "flash_fwd_sm90_kernel.cuh"

namespace tiled_attn {
namespace flash_fwd_sm90 {

using flash_fwd::kMaxGridY;

template <class Tr, typename T>
cudaError_t launch_kernel(Params params, int batch_heads, cudaStream_t stream)
#ifdef TILED_ATTN_EMULATION
    ;  // tests/emulation/flash_fwd_sm90_emulator.cpp runs the CTAs on the CPU
#else
{
  const unsigned m_blocks = static_cast<unsigned>((params.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM);
  return flash_fwd::launch_sliced(flash_fwd_sm90_kernel<Tr, T>, Tr::kThreads, Tr::kSmemBytes, m_blocks,
                                  batch_heads, 1, params, stream);
}
#endif

// Head dim D, element type T (__half or __nv_bfloat16); instantiated in flash_fwd_sm90_hdim<D>.cu.
template <int kHeadDim, typename T>
cudaError_t run_flash_fwd_sm90(const Params& params, int batch_heads, cudaStream_t stream) {
  return launch_kernel<Traits<kHeadDim>, T>(params, batch_heads, stream);
}

}  // namespace flash_fwd_sm90
}  // namespace tiled_attn
