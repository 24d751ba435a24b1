// online_thread.cu — rung 2: one thread per row, two passes: the online recurrence folds max and
// sum into one pass (OnlineState::update per element), then a second pass writes. Saves one of
// naive's three reads of x; still uncoalesced, still a thread per row. Wins only over naive.
#include "common.cuh"

namespace tiled_attn {
namespace softmax {
namespace {

template <typename T>
__global__ void online_thread_kernel(ForwardArgs a) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; row < a.rows; row += stride) {
    const auto in = input_row<T, 1>(a.x, row, a.x_row_stride, a.x_col_stride);
    CompensatedState acc = CompensatedState::identity();  // N sequential folds: compensated sum
    for (int64_t c = 0; c < a.cols; ++c) acc.update(in.at(c));
    const OnlineState s = acc.state();
    const float inv_l = 1.f / s.l;
    T* y = static_cast<T*>(a.y) + row * a.y_row_stride;
    for (int64_t c = 0; c < a.cols; ++c) y[c] = from_float<T>(s.normalize<kAccurate<T>>(in.at(c), inv_l));
  }
}

}  // namespace

cudaError_t forward_online_thread(const ForwardArgs& a, const LaunchConfig& cfg, void*, cudaStream_t stream) {
  if (a.rows == 0 || a.cols == 0) return cudaSuccess;
  const int threads = block_threads(cfg.threads, kMaxThreads);
  return dispatch_dtype(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch(online_thread_kernel<T>, grid_of(ceil_div(a.rows, threads)), dim3(threads), 0, stream, 1, a);
  });
}

}  // namespace softmax
}  // namespace tiled_attn
