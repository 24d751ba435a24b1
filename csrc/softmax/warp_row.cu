// warp_row.cu — rung 5 (OneFlow's warp softmax): a warp per row, the row held in registers
// (kPacks packs of 16 bytes per lane), so x is read once and y written once, and the all-reduces are
// shuffles only: no shared memory, no barrier. Rows up to 1024 columns (32 floats per lane); rows of
// at most 16 packs share a warp (4-, 8- or 16-lane groups). The fastest rung for short rows (N <= 1024).
// A longer row is streamed twice instead (online update, then normalize), still a warp per row,
// correct at any N, but past 1024 the block rungs are the ones to use: caching 2048 columns took 64
// floats a lane and ~200-250 registers (2 blocks an SM, a reduction nothing overlaps).
#include "common.cuh"

namespace tiled_attn {
namespace softmax {
namespace {

// 32 cached values per lane take 63 (fp32) to 80 (bf16) registers on sm_90a, so even 256 threads per
// block leave room for 3 blocks an SM; the launcher clamps the configured block size to this bound.
constexpr int kWarpRowMaxThreads = 256;

template <typename T, int kVec, int kPacks, int kWidth>
__global__ void __launch_bounds__(kWarpRowMaxThreads) warp_row_kernel(ForwardArgs a) {
  for_each_warp_row<kWidth>(a.rows, [&](int64_t row, bool valid, RowGroup<kWidth> g) {
    cached_row_forward<T, kVec, kPacks, kWidth>(a, row, valid, g, nullptr);
  });
}

// Rows past the register cache: each lane folds every 32nd pack, the warp merges, a second pass writes.
constexpr int kUnroll = 4;

template <typename T, int kVec>
__global__ void __launch_bounds__(kWarpRowMaxThreads) warp_row_stream_kernel(ForwardArgs a) {
  for_each_warp_row<kWarpSize>(a.rows, [&](int64_t row, bool valid, RowGroup<kWarpSize> g) {
    const int64_t end = valid ? a.cols : 0, step = int64_t(kWarpSize) * kVec;
    const auto in = input_row<T, kVec>(a.x, valid ? row : 0, a.x_row_stride, a.x_col_stride);
    CompensatedState acc = CompensatedState::identity();  // N / (32 · 4 packs) sequential folds
    for (int64_t c0 = int64_t(g.rank) * kVec; c0 < end; c0 += kUnroll * step) {
      float v[kUnroll * kVec];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) in.load(c0 + u * step, end, -CUDART_INF_F, v + u * kVec);
      acc.update(v);
    }
    const OnlineState s = g.allreduce(acc.state(), nullptr);
    const float inv_l = 1.f / s.l;
    const auto out = output_row<T, kVec>(a.y, row, a.y_row_stride);
    for (int64_t c = int64_t(g.rank) * kVec; c < end; c += step) {
      float v[kVec];
      in.load(c, end, 0.f, v);
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[j] = s.normalize<kAccurate<T>>(v[j], inv_l);
      out.store(c, end, v);
    }
  });
}

template <typename T, int kVec, int kPacks, int kWidth>
cudaError_t launch_cached(const ForwardArgs& a, int threads, cudaStream_t stream) {
  return launch(warp_row_kernel<T, kVec, kPacks, kWidth>, grid_of(ceil_div(a.rows, threads / kWidth)), dim3(threads),
                0, stream, 1, a);
}

}  // namespace

cudaError_t forward_warp_row(const ForwardArgs& a, const LaunchConfig& cfg, void*, cudaStream_t stream) {
  if (a.rows == 0 || a.cols == 0) return cudaSuccess;
  const int threads = block_threads(cfg.threads, kWarpRowMaxThreads);
  return dispatch_dtype(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return dispatch_vec<T>(forward_packable(a, sizeof(T)), [&](auto vec) {
      constexpr int kVec = decltype(vec)::value;
      const int64_t packs = ceil_div(a.cols, kVec);  // packs in the row
      if constexpr (kVec > 1) {  // a row of one pack per lane: narrower groups, more rows per warp
        // 4 lanes: a bf16 row of 32 columns is 4 packs; in 8-lane groups half the lanes idled
        // (measured 40% of copy where fp32's 8 packs reach 91%).
        if (packs <= 4) return launch_cached<T, kVec, 1, 4>(a, threads, stream);
        if (packs <= 8) return launch_cached<T, kVec, 1, 8>(a, threads, stream);
        if (packs <= 16) return launch_cached<T, kVec, 1, 16>(a, threads, stream);
      }
      constexpr int kMaxPacks = kWarpRowMaxColsPerThread / kVec;
      if (ceil_div(packs, kWarpSize) > kMaxPacks) {
        return launch(warp_row_stream_kernel<T, kVec>, grid_of(ceil_div(a.rows, threads / kWarpSize)), dim3(threads), 0,
                      stream, 1, a);
      }
      return pick_pow2<1, kMaxPacks>(ceil_div(packs, kWarpSize), [&](auto p) {
        return launch_cached<T, kVec, decltype(p)::value, kWarpSize>(a, threads, stream);
      });
    });
  });
}

}  // namespace softmax
}  // namespace tiled_attn
