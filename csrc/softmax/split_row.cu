// split_row.cu — rung 9: a row split over several blocks, for rows too long for one SM (or too few
// rows to fill the GPU). Pass 1: each block folds its chunk of the row into one (m, l) state and
// stores it (O(rows × splits) scratch, 8 bytes a state). Pass 2: each block merges its row's states
// (the same merge, in the same order, in every block of the row: identical results) and rewrites its
// chunk normalized. Three transfers (x twice, y once) instead of two, but every SM streams: wins for
// rows past what a cluster caches (N > ~400K) and for a handful of long rows (e.g. 1 × 33M).
#include "common.cuh"

namespace tiled_attn {
namespace softmax {
namespace {

constexpr int kUnroll = 4;  // 16-byte loads in flight per thread before the first is used

template <typename T, int kVec>
__global__ void __launch_bounds__(kMaxThreads)
    split_row_states_kernel(ForwardArgs a, int64_t chunk, int64_t splits, OnlineState* states) {
  __shared__ OnlineState red[kWarpSize];
  const int64_t items = a.rows * splits, step = int64_t(blockDim.x) * kVec;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t row = item / splits, begin = item % splits * chunk;
    const int64_t end = begin + chunk < a.cols ? begin + chunk : a.cols;
    const auto in = input_row<T, kVec>(a.x, row, a.x_row_stride, a.x_col_stride);
    OnlineState s = OnlineState::identity();
    for (int64_t c0 = begin + int64_t(threadIdx.x) * kVec; c0 < end; c0 += kUnroll * step) {
      float v[kUnroll * kVec];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) in.load(c0 + u * step, end, -CUDART_INF_F, v + u * kVec);
      s.update(v);
    }
    s = block_allreduce(s, red, blockDim.x / kWarpSize);
    if (threadIdx.x == 0) states[item] = s;
  }
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kMaxThreads)
    split_row_normalize_kernel(ForwardArgs a, int64_t chunk, int64_t splits, const OnlineState* states) {
  __shared__ OnlineState red[kWarpSize];
  const int64_t items = a.rows * splits, step = int64_t(blockDim.x) * kVec;
  for (int64_t i = blockIdx.x; i < items; i += gridDim.x) {
    // Walk the chunks in reverse: blocks start roughly in blockIdx order, so pass 1 read the last
    // chunks last and those are the ones still in L2 (50 MB on an H100) when pass 2 begins.
    const int64_t item = items - 1 - i;
    const int64_t row = item / splits, begin = item % splits * chunk;
    const int64_t end = begin + chunk < a.cols ? begin + chunk : a.cols;
    OnlineState s = OnlineState::identity();
    for (int64_t k = threadIdx.x; k < splits; k += blockDim.x) s.merge(states[row * splits + k]);
    s = block_allreduce(s, red, blockDim.x / kWarpSize);
    const float inv_l = 1.f / s.l;
    const auto in = input_row<T, kVec>(a.x, row, a.x_row_stride, a.x_col_stride);
    const auto out = output_row<T, kVec>(a.y, row, a.y_row_stride);
    for (int64_t c0 = begin + int64_t(threadIdx.x) * kVec; c0 < end; c0 += kUnroll * step) {
      float v[kUnroll * kVec];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) in.load(c0 + u * step, end, 0.f, v + u * kVec);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[u * kVec + j] = s.normalize<kAccurate<T>>(v[u * kVec + j], inv_l);
        out.store(c0 + u * step, end, v + u * kVec);
      }
    }
  }
}

}  // namespace

int64_t forward_split_row_workspace_bytes(const ForwardArgs& a, const LaunchConfig& cfg) {
  const int64_t chunk = chunk_of(a, cfg);
  if (chunk == 0 || a.rows == 0 || a.cols == 0) return 0;
  return a.rows * ceil_div(a.cols, chunk) * int64_t(sizeof(OnlineState));
}

cudaError_t forward_split_row(const ForwardArgs& a, const LaunchConfig& cfg, void* workspace, cudaStream_t stream) {
  if (a.rows == 0 || a.cols == 0) return cudaSuccess;
  const int64_t chunk = chunk_of(a, cfg);
  if (chunk == 0 || workspace == nullptr) return cudaErrorInvalidValue;
  const int64_t splits = ceil_div(a.cols, chunk);
  auto* states = static_cast<OnlineState*>(workspace);
  const int threads = block_threads(cfg.threads, kMaxThreads);
  const unsigned grid = grid_of(a.rows * splits);
  return dispatch_dtype(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return dispatch_vec<T>(forward_packable(a, sizeof(T)), [&](auto vec) {
      constexpr int kVec = decltype(vec)::value;
      const cudaError_t err =
          launch(split_row_states_kernel<T, kVec>, grid, dim3(threads), 0, stream, 1, a, chunk, splits, states);
      if (err != cudaSuccess) return err;
      return launch(split_row_normalize_kernel<T, kVec>, grid, dim3(threads), 0, stream, 1, a, chunk, splits,
                    static_cast<const OnlineState*>(states));
    });
  });
}

}  // namespace softmax
}  // namespace tiled_attn
