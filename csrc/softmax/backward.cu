// backward.cu — the fused softmax backward, dx = y·(dy − Σ_row dy·y), the backend default for
// backward. One dot product per row, then an elementwise pass: three transfers (y, dy in; dx out)
// is the floor, reached by the first variant, which the launcher picks by row length:
//   rows <= 1024 columns: a warp (or a 4/8/16-lane group) per row, y and dy cached in registers;
//   rows <= chunk:        a block per row, the dot then the write, the re-read served by L1/L2;
//   longer rows:          split over blocks (split_row's shape): partial dots to scratch, then each
//                         block sums its row's partials and writes its chunk.
// The dot is accumulated in double (common.cuh: dx cancels where dy ≈ dot).
#include "common.cuh"

namespace tiled_attn {
namespace softmax {
namespace {

constexpr int kUnroll = 2;  // per operand: y and dy together keep 4 × 16-byte loads in flight a thread
constexpr int kWarpMaxColsPerThread = 32;  // y and dy: 64 cached floats per lane
constexpr int kWarpMaxThreads = 256;

template <typename T, int kVec, int kPacks, int kWidth>
__global__ void __launch_bounds__(kWarpMaxThreads) backward_warp_kernel(BackwardArgs a) {
  for_each_warp_row<kWidth>(a.rows, [&](int64_t row, bool valid, RowGroup<kWidth> g) {
    cached_row_backward<T, kVec, kPacks, kWidth>(a, row, valid, g, nullptr);
  });
}

// This thread's share of Σ y·dy over columns [begin, end), in double (see common.cuh).
template <typename T, int kVec>
__device__ __forceinline__ double partial_dot(const BackwardArgs& a, int64_t row, int64_t begin, int64_t end) {
  const auto y = input_row<T, kVec>(a.y, row, a.y_row_stride, a.y_col_stride);
  const auto dy = input_row<T, kVec>(a.dy, row, a.dy_row_stride, a.dy_col_stride);
  const int64_t step = int64_t(blockDim.x) * kVec;
  double dot = 0.0;
  for (int64_t c0 = begin + int64_t(threadIdx.x) * kVec; c0 < end; c0 += kUnroll * step) {
    float yv[kUnroll * kVec], dv[kUnroll * kVec];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      y.load(c0 + u * step, end, 0.f, yv + u * kVec);
      dy.load(c0 + u * step, end, 0.f, dv + u * kVec);
    }
#pragma unroll
    for (int i = 0; i < kUnroll * kVec; ++i) dot = fma(double(yv[i]), double(dv[i]), dot);
  }
  return dot;
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kMaxThreads)
    backward_dot_kernel(BackwardArgs a, int64_t chunk, int64_t splits, double* dots) {
  __shared__ double red[kWarpSize];
  const int64_t items = a.rows * splits;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t row = item / splits, begin = item % splits * chunk;
    const int64_t end = begin + chunk < a.cols ? begin + chunk : a.cols;
    const double dot = block_allreduce_sum_f64(partial_dot<T, kVec>(a, row, begin, end), red, blockDim.x / kWarpSize);
    if (threadIdx.x == 0) dots[item] = dot;
  }
}

// kSplit: the row's dot comes from backward_dot_kernel's partials (summed in the same order by every
// block of the row); otherwise the block owns the whole row and computes it first.
template <typename T, int kVec, bool kSplit>
__global__ void __launch_bounds__(kMaxThreads)
    backward_write_kernel(BackwardArgs a, int64_t chunk, int64_t splits, const double* dots) {
  __shared__ double red[kWarpSize];
  const int64_t items = a.rows * splits, step = int64_t(blockDim.x) * kVec;
  for (int64_t i = blockIdx.x; i < items; i += gridDim.x) {
    const int64_t item = kSplit ? items - 1 - i : i;  // reversed: the last chunks read are in L2
    const int64_t row = item / splits, begin = item % splits * chunk;
    const int64_t end = begin + chunk < a.cols ? begin + chunk : a.cols;
    double part = 0.0;
    if constexpr (kSplit) {
      for (int64_t k = threadIdx.x; k < splits; k += blockDim.x) part += dots[row * splits + k];
    } else {
      part = partial_dot<T, kVec>(a, row, begin, end);
    }
    const double dot = block_allreduce_sum_f64(part, red, blockDim.x / kWarpSize);
    const auto y = input_row<T, kVec>(a.y, row, a.y_row_stride, a.y_col_stride);
    const auto dy = input_row<T, kVec>(a.dy, row, a.dy_row_stride, a.dy_col_stride);
    const auto dx = output_row<T, kVec>(a.dx, row, a.dx_row_stride);
    for (int64_t c0 = begin + int64_t(threadIdx.x) * kVec; c0 < end; c0 += kUnroll * step) {
      float yv[kUnroll * kVec], dv[kUnroll * kVec];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        y.load(c0 + u * step, end, 0.f, yv + u * kVec);
        dy.load(c0 + u * step, end, 0.f, dv + u * kVec);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) yv[u * kVec + j] = softmax_grad(yv[u * kVec + j], dv[u * kVec + j], dot);
        dx.store(c0 + u * step, end, yv + u * kVec);
      }
    }
  }
}

template <typename T, int kVec, int kPacks, int kWidth>
cudaError_t launch_warp(const BackwardArgs& a, int threads, cudaStream_t stream) {
  return launch(backward_warp_kernel<T, kVec, kPacks, kWidth>, grid_of(ceil_div(a.rows, threads / kWidth)),
                dim3(threads), 0, stream, 1, a);
}

constexpr int64_t kWarpMaxCols = int64_t(kWarpSize) * kWarpMaxColsPerThread;

}  // namespace

int64_t backward_workspace_bytes(const BackwardArgs& a, const LaunchConfig& cfg) {
  const int64_t chunk = chunk_of(a, cfg);
  if (a.rows == 0 || a.cols <= kWarpMaxCols || chunk == 0 || a.cols <= chunk) return 0;
  return a.rows * ceil_div(a.cols, chunk) * int64_t(sizeof(double));
}

cudaError_t backward(const BackwardArgs& a, const LaunchConfig& cfg, void* workspace, cudaStream_t stream) {
  if (a.rows == 0 || a.cols == 0) return cudaSuccess;
  return dispatch_dtype(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return dispatch_vec<T>(backward_packable(a, sizeof(T)), [&](auto vec) {
      constexpr int kVec = decltype(vec)::value;
      const int64_t packs = ceil_div(a.cols, kVec);
      if (a.cols <= kWarpMaxCols) {
        const int threads = block_threads(cfg.threads, kWarpMaxThreads);
        if constexpr (kVec > 1) {
          if (packs <= 4) return launch_warp<T, kVec, 1, 4>(a, threads, stream);  // see warp_row.cu
          if (packs <= 8) return launch_warp<T, kVec, 1, 8>(a, threads, stream);
          if (packs <= 16) return launch_warp<T, kVec, 1, 16>(a, threads, stream);
        }
        return pick_pow2<1, kWarpMaxColsPerThread / kVec>(ceil_div(packs, kWarpSize), [&](auto p) {
          return launch_warp<T, kVec, decltype(p)::value, kWarpSize>(a, threads, stream);
        });
      }
      const int64_t chunk = chunk_of(a, cfg);
      if (chunk == 0) return cudaErrorInvalidValue;
      const int threads = block_threads(cfg.threads, kMaxThreads);
      if (a.cols <= chunk) {
        return launch(backward_write_kernel<T, kVec, false>, grid_of(a.rows), dim3(threads), 0, stream, 1, a, a.cols,
                      int64_t{1}, static_cast<const double*>(nullptr));
      }
      if (workspace == nullptr) return cudaErrorInvalidValue;
      const int64_t splits = ceil_div(a.cols, chunk);
      auto* dots = static_cast<double*>(workspace);
      const unsigned grid = grid_of(a.rows * splits);
      const cudaError_t err = launch(backward_dot_kernel<T, kVec>, grid, dim3(threads), 0, stream, 1, a, chunk, splits, dots);
      if (err != cudaSuccess) return err;
      return launch(backward_write_kernel<T, kVec, true>, grid, dim3(threads), 0, stream, 1, a, chunk, splits,
                    static_cast<const double*>(dots));
    });
  });
}

}  // namespace softmax
}  // namespace tiled_attn
