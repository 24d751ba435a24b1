// block_row_reg.cu — rung 6: a block per row, the row held in registers (kPacks 16-byte packs per
// thread), read once, written once; the row max, then the sum, are all-reduced by warp shuffles plus
// one round through shared memory each. Extends rung 5 past 1024 columns, to 32768 (1024 threads × 32 floats; 8192 for a strided
// row); wins for mid-size rows (a few thousand columns) where a warp would run out of registers.
#include "common.cuh"

namespace tiled_attn {
namespace softmax {
namespace {

// 1024 threads (the block for the longest rows) leave 64 registers a thread: 32 cached floats fit.
template <typename T, int kVec, int kPacks>
__global__ void __launch_bounds__(kMaxThreads) block_row_reg_kernel(ForwardArgs a) {
  __shared__ OnlineState smem[kWarpSize];
  const RowGroup<0> g{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)};
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x)
    cached_row_forward<T, kVec, kPacks, 0>(a, row, true, g, smem);
}

template <typename T, int kVec>
constexpr int kMaxPacks = (kVec > 1 ? kBlockRowRegMaxColsPerThread : kBlockRowRegMaxColsPerThreadScalar) / kVec;

}  // namespace

int64_t forward_block_row_reg_max_cols(const ForwardArgs& a) {
  int64_t cols = 0;
  dispatch_dtype(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return dispatch_vec<T>(forward_packable(a, sizeof(T)), [&](auto vec) {
      constexpr int kVec = decltype(vec)::value;
      cols = int64_t(kMaxThreads) * kMaxPacks<T, kVec> * kVec;
      return cudaSuccess;
    });
  });
  return cols;
}

cudaError_t forward_block_row_reg(const ForwardArgs& a, const LaunchConfig& cfg, void*, cudaStream_t stream) {
  if (a.rows == 0 || a.cols == 0) return cudaSuccess;
  return dispatch_dtype(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return dispatch_vec<T>(forward_packable(a, sizeof(T)), [&](auto vec) {
      constexpr int kVec = decltype(vec)::value;
      constexpr int kMax = kMaxPacks<T, kVec>;
      const int64_t packs = ceil_div(a.cols, kVec);
      // The configured block size, grown (up to 1024) when the row needs more than kMax packs a thread.
      int threads = block_threads(cfg.threads, kMaxThreads);
      if (ceil_div(packs, threads) > kMax)
        threads = block_threads(int(ceil_div(ceil_div(packs, kMax), kWarpSize) * kWarpSize), kMaxThreads);
      return pick_pow2<1, kMax>(ceil_div(packs, threads), [&](auto p) {
        constexpr int kPacks = decltype(p)::value;
        // The fewest whole warps that cover the row at kPacks per thread: no idle warps.
        const int t = block_threads(int(ceil_div(ceil_div(packs, kPacks), kWarpSize) * kWarpSize), kMaxThreads);
        return launch(block_row_reg_kernel<T, kVec, kPacks>, grid_of(a.rows), dim3(t), 0, stream, 1, a);
      });
    });
  });
}

}  // namespace softmax
}  // namespace tiled_attn
