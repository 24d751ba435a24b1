// naive.cu — rung 1: one thread per row, three passes over x (max, Σ exp, write), as in a CPU loop.
// Adds nothing but parallelism over rows: neighbouring threads read addresses a row apart (no
// coalescing) and x is read three times. Wins nowhere; it is the floor the other rungs are timed against
// (and, by accident, the one rung whose loads coalesce for a transposed x, where rows are adjacent).
#include "common.cuh"

namespace tiled_attn {
namespace softmax {
namespace {

template <typename T>
__global__ void naive_kernel(ForwardArgs a) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; row < a.rows; row += stride) {
    const auto in = input_row<T, 1>(a.x, row, a.x_row_stride, a.x_col_stride);
    float m = -CUDART_INF_F;
    for (int64_t c = 0; c < a.cols; ++c) m = fmaxf(m, in.at(c));
    // The max is known before the sum, so the state never rescales: this is Σ exp(x − m), added with
    // compensation (one thread adds all N terms: a plain float sum would drift by sqrt(N)·eps).
    CompensatedState acc{{m, 0.f}, 0.f};
    for (int64_t c = 0; c < a.cols; ++c) acc.update(in.at(c));
    const OnlineState s = acc.state();
    const float inv_l = 1.f / s.l;
    T* y = static_cast<T*>(a.y) + row * a.y_row_stride;
    for (int64_t c = 0; c < a.cols; ++c) y[c] = from_float<T>(s.normalize<kAccurate<T>>(in.at(c), inv_l));
  }
}

}  // namespace

cudaError_t forward_naive(const ForwardArgs& a, const LaunchConfig& cfg, void*, cudaStream_t stream) {
  if (a.rows == 0 || a.cols == 0) return cudaSuccess;
  const int threads = block_threads(cfg.threads, kMaxThreads);
  return dispatch_dtype(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch(naive_kernel<T>, grid_of(ceil_div(a.rows, threads)), dim3(threads), 0, stream, 1, a);
  });
}

}  // namespace softmax
}  // namespace tiled_attn
