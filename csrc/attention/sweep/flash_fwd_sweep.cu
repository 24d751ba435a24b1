// flash_fwd_sweep.cu: instantiates the sweep's kernel variants (flash_fwd_sweep.cuh), bf16, and
// registers their launchers. Built with -DTILED_ATTN_SWEEP_ONLY=i it instantiates variant i alone
// (benchmarks/sweep_cuda_attention.py compiles one object per variant, in parallel); without it, all
// of them (.ci/compile_csrc.sh: every variant compiles without spills). Not part of the extension
// (tiled_attn/cuda/_build.py builds csrc/attention/*.cu only).
#include <cuda_bf16.h>

#include <utility>

#include "../flash_fwd_launch.cuh"
#include "../sm90/flash_fwd_sm90_launch.cuh"
#include "flash_fwd_sweep.cuh"

namespace tiled_attn {
namespace flash_fwd {
namespace {

#ifdef TILED_ATTN_SWEEP_ONLY
constexpr int kFirst = TILED_ATTN_SWEEP_ONLY, kEnd = TILED_ATTN_SWEEP_ONLY + 1;
static_assert(kFirst >= 0 && kFirst < kNumSweep, "TILED_ATTN_SWEEP_ONLY names no variant");
#else
constexpr int kFirst = 0, kEnd = kNumSweep;
#endif

// The variant exactly as listed (a kWs row: the sm90 warp-specialized kernel): kFold variants are
// timed at scale > 0 only (the entry refuses
// others), so their scale <= 0 sibling (run_flash_fwd_cfg) is not built here.
template <int I>
cudaError_t sweep_launch(const Params& p, int batch_heads, cudaStream_t stream) {
  if constexpr (kSweepWs<I>) {
    if (p.seqlen_k == 0) return cudaErrorInvalidValue;  // the sweep's points all have keys
    return flash_fwd_sm90::run_ws_tile<SweepTraits<I>, __nv_bfloat16>(p, batch_heads, stream);
  } else {
    return launch_kernel<SweepTraits<I>, __nv_bfloat16>(p, batch_heads, stream);
  }
}

template <size_t... I>
bool register_range(std::index_sequence<I...>) {
  return (register_sweep(kFirst + static_cast<int>(I), &sweep_launch<kFirst + static_cast<int>(I)>) && ...);
}

const bool registered = register_range(std::make_index_sequence<kEnd - kFirst>{});

}  // namespace
}  // namespace flash_fwd
}  // namespace tiled_attn
