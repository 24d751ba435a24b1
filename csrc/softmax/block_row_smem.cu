// block_row_smem.cu — rung 7: a block per row, the row cached in dynamic shared memory instead of
// registers, so its length is a run-time value (registers need a compile-time count): x is read once,
// y written once, for rows up to ~56K fp32 / ~113K bf16 columns per SM. On sm_90 a row longer than
// one CTA's share is split over a thread-block cluster (up to 8 CTAs on 8 SMs) whose CTAs merge their
// (m, l) states through distributed shared memory, so rows of ~450K fp32 columns still cost one read
// and one write. Wins for long rows that fit on chip (N ~ 4K-400K) when there are enough rows.
#include <algorithm>

#include "common.cuh"
#ifndef TILED_ATTN_EMULATION  // the CPU emulator brings its own cluster (tests/emulation/softmax_emu.h)
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
#endif

// Thread-block clusters exist from sm_90; older device code compiles the single-CTA path only (the
// launcher never asks such a device for a cluster).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define TILED_ATTN_CLUSTERS 1
#else
#define TILED_ATTN_CLUSTERS 0
#endif

namespace tiled_attn {
namespace softmax {
namespace {

// Loads issued before the first is used: 4 × 16 bytes in flight per thread.
constexpr int kUnroll = 4;
// Static shared memory the kernel itself uses (reduction scratch, the cluster's exchange slots),
// rounded up: the rest of the opt-in per-block limit is the row cache.
constexpr int kStaticSmemReserve = 1024;

// Each thread caches exactly the packs it loads and later reads back only those, so the cache needs
// no barrier between the passes (and no bank conflicts: consecutive lanes, consecutive 16 bytes).
template <typename T, int kVec, bool kCluster>
__global__ void __launch_bounds__(kMaxThreads) block_row_smem_kernel(ForwardArgs a, int64_t cta_cols) {
  TA_DYNAMIC_SMEM(unsigned char, smem_raw);
  Pack<T, kVec>* cache = reinterpret_cast<Pack<T, kVec>*>(smem_raw);
  __shared__ OnlineState red[kWarpSize];
#if TILED_ATTN_CLUSTERS
  __shared__ OnlineState cta_state[2];  // this CTA's state for the cluster, double-buffered by row
#endif

  int rank = 0, ctas = 1;
#if TILED_ATTN_CLUSTERS
  if constexpr (kCluster) {
    const cg::cluster_group cluster = cg::this_cluster();
    rank = static_cast<int>(cluster.block_rank());
    ctas = static_cast<int>(cluster.num_blocks());
  }
#endif
  const int64_t begin = rank * cta_cols, end = begin + cta_cols < a.cols ? begin + cta_cols : a.cols;
  const int64_t step = int64_t(blockDim.x) * kVec;
  int parity = 0;
  // A cluster's CTAs are consecutive blocks: all of them walk the same rows, the same number of times.
  for (int64_t row = blockIdx.x / ctas; row < a.rows; row += gridDim.x / ctas, parity ^= 1) {
    const auto in = input_row<T, kVec>(a.x, row, a.x_row_stride, a.x_col_stride);
    OnlineState s = OnlineState::identity();
    for (int64_t c0 = begin + int64_t(threadIdx.x) * kVec; c0 < end; c0 += kUnroll * step) {
      Pack<T, kVec> raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) raw[u] = in.load_raw(c0 + u * step, end);
      float v[kUnroll * kVec];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + u * step;
        if (c < end) cache[(c - begin) / kVec] = raw[u];
        unpack(raw[u], end - c, -CUDART_INF_F, v + u * kVec);
      }
      s.update(v);
    }
    s = block_allreduce(s, red, blockDim.x / kWarpSize);
#if TILED_ATTN_CLUSTERS
    if constexpr (kCluster) {
      // The slot written for this row is not overwritten until two rows later, and no CTA gets there
      // before every CTA has passed the next row's cluster.sync(), i.e. finished reading this one.
      const cg::cluster_group cluster = cg::this_cluster();
      if (threadIdx.x == 0) cta_state[parity] = s;
      cluster.sync();
      const int lane = threadIdx.x % kWarpSize;
      s = lane < ctas ? *cluster.map_shared_rank(&cta_state[parity], lane) : OnlineState::identity();
      s = warp_allreduce(s);
    }
#endif
    const float inv_l = 1.f / s.l;
    const auto out = output_row<T, kVec>(a.y, row, a.y_row_stride);
    for (int64_t c = begin + int64_t(threadIdx.x) * kVec; c < end; c += step) {
      float v[kVec];
      unpack(load_pack<T, kVec>(cache[(c - begin) / kVec].v), end - c, 0.f, v);
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[j] = s.normalize<kAccurate<T>>(v[j], inv_l);
      out.store(c, end, v);
    }
  }
#if TILED_ATTN_CLUSTERS
  if constexpr (kCluster) cg::this_cluster().sync();  // other CTAs may still read our cta_state
#endif
}

struct Plan {
  int ctas;           // CTAs per row (cluster size)
  int64_t cta_cols;   // columns each CTA caches (a multiple of kVec)
  size_t smem_bytes;  // dynamic shared memory per CTA
};

// Largest dynamic shared memory a block may opt into on `device`, less the kernel's static use.
int64_t cache_budget(int device) {
  int optin = 0;
  if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) return 0;
  return (optin - kStaticSmemReserve) / 16 * 16;
}

int max_cluster(int device) {
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return 1;
  return major >= 9 ? kMaxCluster : 1;
}

// The smallest power-of-two cluster (at least cfg.cluster) whose per-CTA share of the row is at most
// cfg.cta_bytes (when set) and fits the shared-memory budget; ctas = 0 when no cluster is enough.
template <typename T, int kVec>
Plan plan(const ForwardArgs& a, const LaunchConfig& cfg, int device) {
  const int64_t budget = cache_budget(device);
  const int64_t target = cfg.cta_bytes > 0 && cfg.cta_bytes < budget ? cfg.cta_bytes : budget;
  const int limit = max_cluster(device);
  for (int ctas = std::min(std::max(cfg.cluster, 1), limit); ctas <= limit; ctas *= 2) {
    const int64_t cta_cols = ceil_div(ceil_div(a.cols, ctas), kVec) * kVec;
    const int64_t bytes = cta_cols * int64_t(sizeof(T));
    if (bytes <= target || (ctas * 2 > limit && bytes <= budget))
      return {ctas, cta_cols, static_cast<size_t>(bytes)};
  }
  return {0, 0, 0};
}

int current_device() {
  int device = 0;
  cudaGetDevice(&device);
  return device;
}

}  // namespace

int64_t forward_block_row_smem_max_cols(const ForwardArgs& a, const LaunchConfig&, int device) {
  int64_t cols = 0;
  dispatch_dtype(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    cols = cache_budget(device) / int64_t(sizeof(T)) * max_cluster(device);
    return cudaSuccess;
  });
  return cols;
}

cudaError_t forward_block_row_smem(const ForwardArgs& a, const LaunchConfig& cfg, void*, cudaStream_t stream) {
  if (a.rows == 0 || a.cols == 0) return cudaSuccess;
  return dispatch_dtype(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return dispatch_vec<T>(forward_packable(a, sizeof(T)), [&](auto vec) {
      constexpr int kVec = decltype(vec)::value;
      const Plan p = plan<T, kVec>(a, cfg, current_device());
      if (p.ctas == 0) return cudaErrorInvalidValue;
      // No more threads than the CTA's share has packs (a short row wastes no warps).
      const int threads = block_threads(
          int(std::min<int64_t>(cfg.threads, ceil_div(ceil_div(p.cta_cols, kVec), kWarpSize) * kWarpSize)),
          kMaxThreads);
      // Whole clusters only (gridDim.x a multiple of the cluster size), capped; rows loop grid-stride.
      const unsigned grid = grid_of(std::min<int64_t>(a.rows, INT_MAX / p.ctas) * p.ctas);
      if (p.ctas > 1)
        return launch(block_row_smem_kernel<T, kVec, true>, grid, dim3(threads), p.smem_bytes, stream, p.ctas, a,
                      p.cta_cols);
      return launch(block_row_smem_kernel<T, kVec, false>, grid, dim3(threads), p.smem_bytes, stream, 1, a, p.cta_cols);
    });
  });
}

}  // namespace softmax
}  // namespace tiled_attn
