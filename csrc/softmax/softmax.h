// softmax.h: the host-side entries of the softmax ladder (csrc/softmax/*.cu). Plain CUDA types only
// (no torch, DESIGN §2): bindings.cpp converts tensors, reads the launch config from
// tiled_attn/configs.py (passed down as LaunchConfig) and calls these.
//
// Every launcher sees an (rows, cols) matrix x with any row and column strides and a row-major y
// (column stride 1, any row stride), sizes and strides in elements as int64, and launches on
// `stream`. It returns the launch's error (cudaGetLastError) or cudaErrorInvalidValue for a size or
// config the kernel does not take; the caller raises both as a Python exception.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace tiled_attn {
namespace softmax {

enum class Dtype : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Softmax of each row of x into y. Both pointers are raw device pointers of `dtype`.
struct ForwardArgs {
  Dtype dtype;
  const void* x;
  int64_t x_row_stride, x_col_stride;
  void* y;
  int64_t y_row_stride;
  int64_t rows, cols;
};

// dx = y·(dy − Σ dy·y) row by row; y and dy with any strides, dx row-major.
struct BackwardArgs {
  Dtype dtype;
  const void* y;
  int64_t y_row_stride, y_col_stride;
  const void* dy;
  int64_t dy_row_stride, dy_col_stride;
  void* dx;
  int64_t dx_row_stride;
  int64_t rows, cols;
};

// One row of the CUDA_SOFTMAX table (tiled_attn/configs.py). Fields a kernel does not use are ignored.
struct LaunchConfig {
  int threads = 256;        // threads per block (a multiple of 32; a power of two for block_smem_tree)
  int cluster = 1;          // block_row_smem: the fewest CTAs that share one row (a cluster, sm_90+)
  int64_t cta_bytes = 0;    // block_row_smem: most row bytes one CTA caches before the row is split
                            // over a larger cluster (0: as many as fit in shared memory)
  int64_t chunk = 0;        // split_row / backward: columns per block when a row is split over blocks
};

// Compile-time sizes the launchers and the limits below share.
constexpr int kMaxThreads = 1024;
constexpr int kMaxCluster = 8;                    // the portable cluster size limit
constexpr int kWarpRowMaxColsPerThread = 32;      // warp_row caches 32 lanes × 32 = 1024 columns
// block_row_reg: 1024 threads × 32 = 32768 columns with 16-byte packs; a strided (scalar) row keeps
// an address per element live as well, so it caches 8 per thread (8192 columns) to stay unspilled
// within the 64 registers a 1024-thread block leaves each thread.
constexpr int kBlockRowRegMaxColsPerThread = 32;
constexpr int kBlockRowRegMaxColsPerThreadScalar = 8;
// flat_rows: a row in one group of at most 32 lanes, 64 cached values a lane.
constexpr int kFlatRowsMaxCols = 2048;

using ForwardLauncher = cudaError_t (*)(const ForwardArgs&, const LaunchConfig&, void* workspace,
                                        cudaStream_t);

// The ladder, one launcher per csrc/softmax/<name>.cu. Only split_row uses `workspace`.
cudaError_t forward_naive(const ForwardArgs&, const LaunchConfig&, void* workspace, cudaStream_t);
cudaError_t forward_online_thread(const ForwardArgs&, const LaunchConfig&, void* workspace, cudaStream_t);
cudaError_t forward_block_smem_tree(const ForwardArgs&, const LaunchConfig&, void* workspace, cudaStream_t);
cudaError_t forward_block_shuffle(const ForwardArgs&, const LaunchConfig&, void* workspace, cudaStream_t);
cudaError_t forward_warp_row(const ForwardArgs&, const LaunchConfig&, void* workspace, cudaStream_t);
cudaError_t forward_block_row_reg(const ForwardArgs&, const LaunchConfig&, void* workspace, cudaStream_t);
cudaError_t forward_block_row_smem(const ForwardArgs&, const LaunchConfig&, void* workspace, cudaStream_t);
cudaError_t forward_tile2d(const ForwardArgs&, const LaunchConfig&, void* workspace, cudaStream_t);
cudaError_t forward_split_row(const ForwardArgs&, const LaunchConfig&, void* workspace, cudaStream_t);
cudaError_t forward_flat_rows(const ForwardArgs&, const LaunchConfig&, void* workspace, cudaStream_t);

// The ladder by name, slowest rung first: the names ta.softmax(..., backend="cuda", kernel=NAME)
// takes (tiled_attn/cuda/softmax.py SOFTMAX_KERNELS), for the bindings and the CPU emulator alike.
struct ForwardKernel {
  const char* name;
  ForwardLauncher launch;
};
inline constexpr ForwardKernel kForwardKernels[] = {
    {"naive", forward_naive},
    {"online_thread", forward_online_thread},
    {"block_smem_tree", forward_block_smem_tree},
    {"block_shuffle", forward_block_shuffle},
    {"warp_row", forward_warp_row},
    {"block_row_reg", forward_block_row_reg},
    {"block_row_smem", forward_block_row_smem},
    {"tile2d", forward_tile2d},
    {"split_row", forward_split_row},
    {"flat_rows", forward_flat_rows},
};

// Bytes of device scratch split_row needs (one (m, l) state per block of each row), 0 for others.
int64_t forward_split_row_workspace_bytes(const ForwardArgs&, const LaunchConfig&);

// The fused backward (backward.cu): register-cached for rows that fit, split over blocks beyond.
cudaError_t backward(const BackwardArgs&, const LaunchConfig&, void* workspace, cudaStream_t);
int64_t backward_workspace_bytes(const BackwardArgs&, const LaunchConfig&);

// The longest row (columns) the on-chip kernels take for these operands (their alignment decides
// between packed and scalar access) on `device`; the other kernels take any length. The bindings
// check it before launching and raise ValueError naming the limit.
int64_t forward_block_row_reg_max_cols(const ForwardArgs&);
int64_t forward_block_row_smem_max_cols(const ForwardArgs&, const LaunchConfig&, int device);
int64_t forward_flat_rows_max_cols();

}  // namespace softmax
}  // namespace tiled_attn
