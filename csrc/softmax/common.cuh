// common.cuh: what the softmax ladder's kernels share: dtype conversion, 16-byte packed row access,
// host-side dispatch over dtype and access width, and the bodies that two rungs instantiate with a
// different constexpr parameter (instead of two copies that differ in one line). The recurrence
// itself is not here: every kernel calls the verbs of ../online_softmax.cuh.
//
// Access width kVec: 16 / sizeof(T) elements per load (one 128-bit LDG/STG, the widest a thread
// issues) when x and y are 16-byte aligned, rows are contiguous and row strides keep every row
// aligned; 1 otherwise, then the column stride is honoured (transposed or step-sliced input: correct,
// slow, never copied). A row's last pack may be partial (any N): it is read and written element-wise.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "../online_softmax.cuh"
#include "softmax.h"

namespace tiled_attn {
namespace softmax {

// ------------------------------------------------------------------------------------------------
// Launching: every launcher goes through launch(), the one place that knows the launch API, and
// declares dynamic shared memory with TA_DYNAMIC_SMEM. Built with TILED_ATTN_EMULATION (the CPU
// emulator, tests/emulation/softmax_emu.h), both come from the emulator instead.
// ------------------------------------------------------------------------------------------------
#ifndef TILED_ATTN_EMULATION
#define TA_DYNAMIC_SMEM(type, name) extern __shared__ __align__(16) type name[]

// `cluster` > 1 launches thread-block clusters of that many CTAs along x (sm_90+); dynamic shared
// memory above 48 KB is opted into first. Returns the launch's error.
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), unsigned grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                   int cluster, Args&&... args) {
  if (smem_bytes > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes));
    if (err != cudaSuccess) return err;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid);
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  if (cluster > 1) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(cluster);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    config.attrs = attr;
    config.numAttrs = 1;
  }
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  return err != cudaSuccess ? err : cudaGetLastError();
}
#endif

// ------------------------------------------------------------------------------------------------
// dtype <-> float (all accumulation is float32)
// ------------------------------------------------------------------------------------------------
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename T>
constexpr int kPackOf = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte access

// The output's exponential and division in their accurate forms (expf, IEEE division) for float32
// outputs, where the numerics rule leaves a few ulps (the error budget in ../online_softmax.cuh);
// the fast forms (exp2f, a multiply by 1/l) for 16-bit outputs, whose rounding hides them.
template <typename T>
constexpr bool kAccurate = std::is_same<T, float>::value;

template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

// A 16-byte pack moves as one uint4 (LDG.128 / LDS.128 / STG.128). Copied as a struct of 16-bit
// class-type elements, nvcc 13 lost the pack's alignment and stored 16 bytes as four STG.U16x2 or
// eight STG.U16 (PTX of split_row, block_row_smem's cluster path, the split backward: no
// st.global.v4 at all, in fp32 four st.global.f32), and a bf16 row ran at the element rate of
// fp32's (26-36% of copy, half of fp32's %). A uint4 store built from the pack was split the same
// way, so a global pack store is the one instruction itself (__stwb: st.global.wb.v4.u32, the
// default write-back policy). Scalar packs (kVec == 1) copy as they are.
template <typename T, int kVec>
__device__ __forceinline__ Pack<T, kVec> load_pack(const T* src) {
  Pack<T, kVec> pk;
  if constexpr (sizeof(pk) == 16) {
    const uint4 u = *reinterpret_cast<const uint4*>(src);
    memcpy(&pk, &u, 16);
  } else {
    pk = *reinterpret_cast<const Pack<T, kVec>*>(src);
  }
  return pk;
}

template <typename T, int kVec>
__device__ __forceinline__ void store_global_pack(T* dst, const Pack<T, kVec>& pk) {
  if constexpr (sizeof(pk) == 16) {
    uint4 u;
    memcpy(&u, &pk, 16);
#ifdef TILED_ATTN_EMULATION
    *reinterpret_cast<uint4*>(dst) = u;
#else
    __stwb(reinterpret_cast<uint4*>(dst), u);
#endif
  } else {
    *reinterpret_cast<Pack<T, kVec>*>(dst) = pk;
  }
}

// One input row: element c is p[c · stride] (stride is 1 whenever kVec > 1).
template <typename T, int kVec>
struct RowIn {
  const T* p;
  int64_t stride;

  __device__ __forceinline__ float at(int64_t col) const { return to_float(p[col * stride]); }

  // The pack at `col` (a multiple of kVec) as raw elements; those at or past `end` are zero.
  __device__ __forceinline__ Pack<T, kVec> load_raw(int64_t col, int64_t end) const {
    Pack<T, kVec> pk;
    if (kVec > 1 && col + kVec <= end) {
      pk = load_pack<T, kVec>(p + col);
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) pk.v[j] = col + j < end ? p[(col + j) * stride] : T{};
    }
    return pk;
  }

  // The pack at `col` as floats; elements at or past `end` read as `fill` (the reduction's identity).
  __device__ __forceinline__ void load(int64_t col, int64_t end, float fill, float* v) const {
    if (kVec > 1 && col + kVec <= end) {
      const Pack<T, kVec> pk = load_pack<T, kVec>(p + col);
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[j] = to_float(pk.v[j]);
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[j] = col + j < end ? to_float(p[(col + j) * stride]) : fill;
    }
  }
};

template <typename T, int kVec>
__device__ __forceinline__ void unpack(const Pack<T, kVec>& pk, int64_t valid, float fill, float* v) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) v[j] = j < valid ? to_float(pk.v[j]) : fill;
}

// One row-major output row.
template <typename T, int kVec>
struct RowOut {
  T* p;

  // Writes the pack at `col`; elements at or past `end` are left alone.
  __device__ __forceinline__ void store(int64_t col, int64_t end, const float* v) const {
    if (kVec > 1 && col + kVec <= end) {
      Pack<T, kVec> pk;
#pragma unroll
      for (int j = 0; j < kVec; ++j) pk.v[j] = from_float<T>(v[j]);
      store_global_pack<T, kVec>(p + col, pk);
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j)
        if (col + j < end) p[col + j] = from_float<T>(v[j]);
    }
  }
};

template <typename T, int kVec>
__device__ __forceinline__ RowIn<T, kVec> input_row(const void* base, int64_t row, int64_t row_stride,
                                                    int64_t col_stride) {
  return {static_cast<const T*>(base) + row * row_stride, kVec > 1 ? 1 : col_stride};
}

template <typename T, int kVec>
__device__ __forceinline__ RowOut<T, kVec> output_row(void* base, int64_t row, int64_t row_stride) {
  return {static_cast<T*>(base) + row * row_stride};
}

// Σ in double across kWidth lanes / a block, for the backward's dot product: dx = y·(dy − dot)
// cancels where dy ≈ dot, so the dot's own rounding shows in dx at full size; float partial sums of
// a long row drift by ~sqrt(N)·eps and lose the numerics rule's 2× margin to torch by luck of the
// order. One DFMA per element is free in a memory-bound kernel (H100: 67 TFLOP/s fp64).
template <int kWidth>
__device__ __forceinline__ double warp_allreduce_sum_f64(double v) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// `smem` holds 32 doubles; the trailing barrier lets the caller reuse it at once.
__device__ __forceinline__ double block_allreduce_sum_f64(double v, double* smem, int num_warps) {
  v = warp_allreduce_sum_f64<kWarpSize>(v);
  if (num_warps == 1) return v;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < num_warps ? smem[lane] : 0.0;
  v = warp_allreduce_sum_f64<kWarpSize>(v);
  __syncthreads();
  return v;
}

// The threads that share one row: kWidth consecutive lanes of a warp (kWidth <= 32, all-reduce by
// shuffles), or kWidth == 0: the whole block (warp shuffles, then shared memory).
template <int kWidth>
struct RowGroup {
  int rank, size;

  __device__ __forceinline__ OnlineState allreduce(OnlineState s, OnlineState* smem) const {
    if constexpr (kWidth > 0) return warp_allreduce<kWidth>(s);
    else return block_allreduce(s, smem, size / kWarpSize);
  }
  __device__ __forceinline__ double allreduce_sum(double v, double* smem) const {
    if constexpr (kWidth > 0) return warp_allreduce_sum_f64<kWidth>(v);
    else return block_allreduce_sum_f64(v, smem, size / kWarpSize);
  }
};

// ------------------------------------------------------------------------------------------------
// Register-cached rows (warp_row, block_row_reg, the backward's small rows): the group's threads
// hold the row in registers, kPacks packs each, so x is read once and y written once. Thread `rank`
// owns packs rank, rank + size, ... (consecutive threads read consecutive 16-byte packs: coalesced).
// `valid` is false for a padding row (a warp's spare row group past the last row): it still takes
// part in the all-reduce, whose shuffles need every lane, and writes nothing.
// The whole row is on chip, so its max is all-reduced before any exponential: each exp(x − m) is
// then taken once, against the final max, kept in place of x and divided by l (torch's order of
// operations; no online rescale, no second exponential). One more all-reduce per row than the
// online fold, of a max: cheap next to the row's loads.
// ------------------------------------------------------------------------------------------------
// The state of a row the group holds whole in registers (v, padding -inf): the row max all-reduced
// first, then v <- exp(v - max) (each exponential once, against the final max) and l their sum,
// all-reduced. normalize_exp(v[i], 1/l) then gives the outputs.
template <typename T, int N, int kWidth>
__device__ __forceinline__ OnlineState cached_row_state(float (&v)[N], RowGroup<kWidth> g, OnlineState* smem) {
  OnlineState s = g.allreduce(OnlineState::max_of(v), smem);  // (row max, 0)
  s.update_at_max<kAccurate<T>>(v);                            // v <- exp(v - max), l = its sum
  return g.allreduce(s, smem);                                 // one max everywhere: l summed
}

template <typename T, int kVec, int kPacks, int kWidth>
__device__ __forceinline__ void cached_row_forward(const ForwardArgs& a, int64_t row, bool valid,
                                                   RowGroup<kWidth> g, OnlineState* smem) {
  const int64_t end = valid ? a.cols : 0;
  const auto in = input_row<T, kVec>(a.x, valid ? row : 0, a.x_row_stride, a.x_col_stride);
  float v[kPacks * kVec];
#pragma unroll
  for (int p = 0; p < kPacks; ++p)
    in.load((int64_t(p) * g.size + g.rank) * kVec, end, -CUDART_INF_F, v + p * kVec);
  const OnlineState s = cached_row_state<T>(v, g, smem);
  if (!valid) return;
  const float inv_l = 1.f / s.l;
  const auto out = output_row<T, kVec>(a.y, row, a.y_row_stride);
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[p * kVec + j] = s.normalize_exp<kAccurate<T>>(v[p * kVec + j], inv_l);
    out.store((int64_t(p) * g.size + g.rank) * kVec, a.cols, v + p * kVec);
  }
}

// dx = y·(dy − dot), the difference and the product in double and rounded once: in float, where
// dy ≈ dot the difference would carry the dot's own float rounding (up to an ulp of dot) into dx
// at full size, measured at 1 ulp of dx where torch's float code happened to be within 0.25.
__device__ __forceinline__ float softmax_grad(float y, float dy, double dot) {
  return static_cast<float>(double(y) * (double(dy) - dot));
}

template <typename T, int kVec, int kPacks, int kWidth>
__device__ __forceinline__ void cached_row_backward(const BackwardArgs& a, int64_t row, bool valid,
                                                    RowGroup<kWidth> g, double* smem) {
  const int64_t end = valid ? a.cols : 0, r = valid ? row : 0;
  const auto y = input_row<T, kVec>(a.y, r, a.y_row_stride, a.y_col_stride);
  const auto dy = input_row<T, kVec>(a.dy, r, a.dy_row_stride, a.dy_col_stride);
  float yv[kPacks * kVec], dv[kPacks * kVec];
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const int64_t col = (int64_t(p) * g.size + g.rank) * kVec;
    y.load(col, end, 0.f, yv + p * kVec);
    dy.load(col, end, 0.f, dv + p * kVec);
  }
  double sum = 0.0;
#pragma unroll
  for (int i = 0; i < kPacks * kVec; ++i) sum = fma(double(yv[i]), double(dv[i]), sum);
  const double dot = g.allreduce_sum(sum, smem);
  if (!valid) return;
  const auto dx = output_row<T, kVec>(a.dx, row, a.dx_row_stride);
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) yv[p * kVec + j] = softmax_grad(yv[p * kVec + j], dv[p * kVec + j], dot);
    dx.store((int64_t(p) * g.size + g.rank) * kVec, a.cols, yv + p * kVec);
  }
}

// A warp-per-row grid-stride loop over rows. The loop runs over a warp's first row, so its trip
// count is the same for every lane and the shuffles inside never see an exited lane.
template <int kWidth, typename Body>
__device__ __forceinline__ void for_each_warp_row(int64_t rows, Body&& body) {
  constexpr int kRowsPerWarp = kWarpSize / kWidth;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / kWarpSize;
  for (int64_t first = warp * kRowsPerWarp; first < rows; first += warps * kRowsPerWarp) {
    const int64_t row = first + lane / kWidth;
    body(row, row < rows, RowGroup<kWidth>{lane % kWidth, kWidth});
  }
}

// ------------------------------------------------------------------------------------------------
// The two-pass block-per-row baseline (block_smem_tree, block_shuffle): each thread folds a strided
// slice of the row into its own state, the block all-reduces the states (Reduce: the rung's step),
// then a second pass over x writes y. Scalar loads, any strides: the packed, cached rungs come next.
// Reduce::allreduce(s, smem) gets `smem` of Reduce::smem_states(blockDim.x) states.
// ------------------------------------------------------------------------------------------------
template <typename T, typename Reduce>
__global__ void two_pass_block_kernel(ForwardArgs a) {
  TA_DYNAMIC_SMEM(OnlineState, reduce_smem);
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const auto in = input_row<T, 1>(a.x, row, a.x_row_stride, a.x_col_stride);
    CompensatedState acc = CompensatedState::identity();  // N / threads sequential folds
    for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) acc.update(in.at(c));
    const OnlineState s = Reduce::allreduce(acc.state(), reduce_smem);
    const float inv_l = 1.f / s.l;
    T* y = static_cast<T*>(a.y) + row * a.y_row_stride;
    for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x)
      y[c] = from_float<T>(s.normalize<kAccurate<T>>(in.at(c), inv_l));
  }
}

// ------------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------------
template <typename T>
struct TypeTag {
  using type = T;
};

template <typename F>
cudaError_t dispatch_dtype(Dtype dtype, F&& f) {
  switch (dtype) {
    case Dtype::kFloat32: return f(TypeTag<float>{});
    case Dtype::kFloat16: return f(TypeTag<__half>{});
    case Dtype::kBFloat16: return f(TypeTag<__nv_bfloat16>{});
  }
  return cudaErrorInvalidValue;
}

template <int kVec>
using VecTag = std::integral_constant<int, kVec>;

// Calls f(VecTag<kPackOf<T>>) when every operand allows 16-byte packs, else f(VecTag<1>).
template <typename T, typename F>
cudaError_t dispatch_vec(bool packed, F&& f) {
  if (packed) return f(VecTag<kPackOf<T>>{});
  return f(VecTag<1>{});
}

// True when a (rows, cols) operand can be read or written in 16-byte packs: contiguous rows, a
// 16-byte aligned start and a row stride that keeps every row start aligned.
inline bool packable(const void* p, int64_t rows, int64_t row_stride, int64_t cols, int64_t col_stride,
                     int elem_bytes) {
  const bool contiguous = col_stride == 1 || cols == 1;
  const bool rows_aligned = rows == 1 || (row_stride * elem_bytes) % 16 == 0;
  return contiguous && rows_aligned && reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

inline bool forward_packable(const ForwardArgs& a, int elem_bytes) {
  return packable(a.x, a.rows, a.x_row_stride, a.cols, a.x_col_stride, elem_bytes) &&
         packable(a.y, a.rows, a.y_row_stride, a.cols, 1, elem_bytes);
}

inline bool backward_packable(const BackwardArgs& a, int elem_bytes) {
  return packable(a.y, a.rows, a.y_row_stride, a.cols, a.y_col_stride, elem_bytes) &&
         packable(a.dy, a.rows, a.dy_row_stride, a.cols, a.dy_col_stride, elem_bytes) &&
         packable(a.dx, a.rows, a.dx_row_stride, a.cols, 1, elem_bytes);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Columns per block of a row split over blocks (split_row, the split backward): the configured
// chunk rounded up to whole 16-byte packs, so no pack straddles two blocks. 0 when the config has
// no chunk. Args: ForwardArgs or BackwardArgs.
template <typename Args>
int64_t chunk_of(const Args& a, const LaunchConfig& cfg) {
  int64_t chunk = 0;
  dispatch_dtype(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    chunk = cfg.chunk > 0 ? ceil_div(cfg.chunk, kPackOf<T>) * kPackOf<T> : 0;
    return cudaSuccess;
  });
  return chunk;
}

// gridDim.x is at most 2^31 − 1; every kernel loops grid-stride over its work, so capping is safe.
inline unsigned grid_of(int64_t blocks) {
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > INT_MAX ? INT_MAX : blocks));
}

// A block size from the config: whole warps in [32, cap].
inline int block_threads(int requested, int cap) {
  int t = requested < kWarpSize ? kWarpSize : (requested > cap ? cap : requested);
  return t / kWarpSize * kWarpSize;
}

// Calls f(std::integral_constant<int, P>) for the smallest power of two P in [kLo, kHi] with
// P >= need; cudaErrorInvalidValue when need > kHi. Instantiates only the powers of two in range.
template <int kLo, int kHi, typename F>
cudaError_t pick_pow2(int64_t need, F&& f) {
  if constexpr (kLo > kHi) {
    return cudaErrorInvalidValue;
  } else {
    if (need <= kLo) return f(std::integral_constant<int, kLo>{});
    return pick_pow2<kLo * 2, kHi>(need, f);
  }
}

}  // namespace softmax
}  // namespace tiled_attn
