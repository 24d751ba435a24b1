// flat_rows.cu — rung 10: short rows of any length at the 16-byte access width. warp_row moves a row
// in 16-byte packs only when every row start is 16-byte aligned (N a multiple of 4 in fp32, of 8 in
// 16-bit); at any other N each lane issues one load and one store per element, each with its own
// address, and an SM runs out of issue slots before the memory runs out of bandwidth (H200, fp32 rows
// of 23-89 columns: 0.61-0.82x torch.softmax, benchmarks/results/sweeps/2026-11-26-h200-softmax-
// random-sweep-2.md). But R consecutive rows of a row-major tensor are one contiguous span of R·N
// elements, whatever N: a block copies its span into shared memory in 16-byte packs (element by
// element only before the span's first 16-byte boundary and after its last), groups of kWidth lanes
// take a row at a time from shared memory into registers (kPer values a lane), all-reduce it by shuffles
// as warp_row does (common.cuh's cached_row_state: the max, then exp(x − max) once, then the sum),
// write the outputs back in place, and the block stores the span to y in 16-byte packs.
// Rows of up to kFlatRowsMaxCols columns. Operands that are not row-major (strided columns, padded
// rows) or whose two spans sit differently against the 16-byte grid pass through the same shared
// memory element by element: correct, and no faster than warp_row.
#include <algorithm>

#include "common.cuh"

namespace tiled_attn {
namespace softmax {
namespace {

// kPer = 64 cached floats a lane (rows of 2048) take ~100 registers on sm_90a: 256 threads a block.
constexpr int kFlatRowsMaxThreads = 256;
// A block's span when the config sets no cta_bytes: 48 KB needs no opt-in and leaves 4 blocks an SM.
constexpr int64_t kFlatRowsDefaultSpanBytes = 48 * 1024;
// Rows a lane group takes per tile, at most (the loop is not unrolled: a bound on the tile only).
constexpr int64_t kFlatRowsMaxReps = 64;

// Elements before the first 16-byte boundary at or after p (0 when p is aligned).
template <typename T>
__device__ __forceinline__ int head_of(const T* p) {
  return static_cast<int>((16 - reinterpret_cast<uintptr_t>(p) % 16) % 16) / static_cast<int>(sizeof(T));
}

// Copies src[0, count) to dst[0, count) with the whole block, where `head` elements come before the
// first 16-byte boundary of both src and dst: 16-byte packs from there on, single elements around
// them. kToGlobal: dst is y (the pack store is common.cuh's one-instruction store).
template <typename T, bool kToGlobal>
__device__ __forceinline__ void copy_aligned(const T* src, T* dst, int count, int head) {
  constexpr int kVec = kPackOf<T>;
  const int lead = head < count ? head : count;
  const int packs = (count - lead) / kVec, tail = lead + packs * kVec;
  for (int i = threadIdx.x; i < lead; i += blockDim.x) dst[i] = src[i];
  for (int p = threadIdx.x; p < packs; p += blockDim.x) {
    const Pack<T, kVec> pk = load_pack<T, kVec>(src + lead + p * kVec);
    if constexpr (kToGlobal) {
      store_global_pack<T, kVec>(dst + lead + p * kVec, pk);
    } else {
      uint4 u;
      memcpy(&u, &pk, 16);
      *reinterpret_cast<uint4*>(dst + lead + p * kVec) = u;
    }
  }
  for (int i = tail + threadIdx.x; i < count; i += blockDim.x) dst[i] = src[i];
}

struct FlatPlan {
  bool x_flat, y_flat;  // row-major with rows back to back (row stride N, column stride 1)
  int reps;             // rows a lane group takes per tile: the tile is groups × reps rows
};

template <typename T, int kWidth, int kPer>
__global__ void __launch_bounds__(kFlatRowsMaxThreads) flat_rows_kernel(ForwardArgs a, FlatPlan f) {
  constexpr int kVec = kPackOf<T>;
  TA_DYNAMIC_SMEM(unsigned char, smem_raw);  // one extern name for every T (nvcc's rule)
  T* span = reinterpret_cast<T*>(smem_raw);
  const int n = static_cast<int>(a.cols);
  const int groups = blockDim.x / kWidth, rows_per_tile = groups * f.reps;
  const int group = threadIdx.x / kWidth, rank = threadIdx.x % kWidth;
  const int64_t tiles = (a.rows + rows_per_tile - 1) / rows_per_tile;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t r0 = tile * rows_per_tile;
    const int rows = static_cast<int>(a.rows - r0 < rows_per_tile ? a.rows - r0 : rows_per_tile);
    const int count = rows * n;
    const T* x = static_cast<const T*>(a.x);
    T* y = static_cast<T*>(a.y);
    // The span starts `pad` elements into shared memory, so that x's (else y's) 16-byte boundaries
    // fall on shared memory's.
    const int head_x = f.x_flat ? head_of(x + r0 * n) : -1;
    const int head_y = f.y_flat ? head_of(y + r0 * n) : -1;
    const int pad = (kVec - (head_x >= 0 ? head_x : head_y >= 0 ? head_y : 0)) % kVec;
    T* buf = span + pad;
    if (f.x_flat) {
      copy_aligned<T, false>(x + r0 * n, buf, count, head_x);
    } else {
      for (int i = threadIdx.x; i < count; i += blockDim.x) {
        const int r = i / n, c = i - r * n;
        buf[i] = x[(r0 + r) * a.x_row_stride + c * a.x_col_stride];
      }
    }
    __syncthreads();

    for (int rep = 0; rep < f.reps; ++rep) {
      // A group past the tile's last row still joins its warp's shuffles and writes nothing.
      const int r = rep * groups + group;
      const bool valid = r < rows;
      T* row = buf + (valid ? r : 0) * n;
      float v[kPer];
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int c = rank + k * kWidth;
        v[k] = valid && c < n ? to_float(row[c]) : -CUDART_INF_F;
      }
      const OnlineState s = cached_row_state<T>(v, RowGroup<kWidth>{rank, kWidth}, nullptr);
      if (valid) {
        const float inv_l = 1.f / s.l;
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          const int c = rank + k * kWidth;
          if (c < n) row[c] = from_float<T>(s.normalize_exp<kAccurate<T>>(v[k], inv_l));
        }
      }
    }
    __syncthreads();

    if (f.y_flat && (pad + head_y) % kVec == 0) {
      copy_aligned<T, true>(buf, y + r0 * n, count, head_y);
    } else {
      for (int i = threadIdx.x; i < count; i += blockDim.x) {
        const int r = i / n, c = i - r * n;
        y[(r0 + r) * a.y_row_stride + c] = buf[i];
      }
    }
    __syncthreads();  // the next tile's copy overwrites the span
  }
}

// Lanes a row: about 8 values a lane, at least 4 lanes (rows of <= 32 columns share a warp 8 to a
// warp), at most the warp. kPer: the cached values a lane, a power of two.
template <typename F>
cudaError_t pick_width(int n, F&& f) {
  if (n <= 32) return f(std::integral_constant<int, 4>{});
  if (n <= 64) return f(std::integral_constant<int, 8>{});
  if (n <= 128) return f(std::integral_constant<int, 16>{});
  return f(std::integral_constant<int, 32>{});
}

}  // namespace

int64_t forward_flat_rows_max_cols() { return kFlatRowsMaxCols; }

cudaError_t forward_flat_rows(const ForwardArgs& a, const LaunchConfig& cfg, void*, cudaStream_t stream) {
  if (a.rows == 0 || a.cols == 0) return cudaSuccess;
  if (a.cols > kFlatRowsMaxCols) return cudaErrorInvalidValue;
  FlatPlan f{(a.x_col_stride == 1 || a.cols == 1) && (a.x_row_stride == a.cols || a.rows == 1),
             a.y_row_stride == a.cols || a.rows == 1, 1};
  const int n = static_cast<int>(a.cols);
  return dispatch_dtype(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return pick_width(n, [&](auto w) {
      constexpr int kWidth = decltype(w)::value;
      constexpr int kLo = kWidth == 4 ? 1 : 8, kHi = kWidth == 32 ? kFlatRowsMaxCols / 32 : 8;
      return pick_pow2<kLo, kHi>(ceil_div(n, kWidth), [&](auto p) {
        constexpr int kPer = decltype(p)::value;
        // The configured block, cut to the rows whose span fits the block's shared memory; then as
        // many rows a group as fill it (more 16-byte loads in flight a thread, one barrier pair for
        // all of them).
        const int64_t span_bytes = cfg.cta_bytes > 0 ? cfg.cta_bytes : kFlatRowsDefaultSpanBytes;
        const int64_t fit = span_bytes / (int64_t(n) * int64_t(sizeof(T)));
        int threads = block_threads(cfg.threads, kFlatRowsMaxThreads);
        if (threads / kWidth > fit) threads = block_threads(int((fit < 1 ? 1 : fit) * kWidth), kFlatRowsMaxThreads);
        const int64_t groups = threads / kWidth;
        f.reps = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(kFlatRowsMaxReps, fit / groups)));
        const int64_t rows_per_tile = groups * f.reps;
        const size_t smem = size_t(ceil_div((rows_per_tile * n + kPackOf<T>) * int64_t(sizeof(T)), 16) * 16);
        return launch(flat_rows_kernel<T, kWidth, kPer>, grid_of(ceil_div(a.rows, rows_per_tile)), dim3(threads),
                      smem, stream, 1, a, f);
      });
    });
  });
}

}  // namespace softmax
}  // namespace tiled_attn
