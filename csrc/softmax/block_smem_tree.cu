// block_smem_tree.cu — rung 3: one block per row. Each thread folds a strided slice of the row
// (consecutive threads, consecutive columns: coalesced), then the block merges its states with a
// shared-memory tree, log2(threads) steps each behind a barrier. The first rung that puts more than
// one thread on a row, so it wins over rungs 1-2 as soon as rows are long or few.
#include "common.cuh"

namespace tiled_attn {
namespace softmax {
namespace {

// Block size: a power of two (the tree halves it each step). smem holds blockDim.x states.
struct TreeReduce {
  static int smem_states(int threads) { return threads; }

  static __device__ __forceinline__ OnlineState allreduce(OnlineState s, OnlineState* smem) {
    const int tid = threadIdx.x;
    smem[tid] = s;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
      // Thread tid alone writes smem[tid]; smem[tid + stride] was last written before the barrier.
      if (tid < stride) smem[tid].merge(smem[tid + stride]);
      __syncthreads();
    }
    s = smem[0];
    __syncthreads();  // every thread has read smem[0] before the next row overwrites it
    return s;
  }
};

}  // namespace

cudaError_t forward_block_smem_tree(const ForwardArgs& a, const LaunchConfig& cfg, void*, cudaStream_t stream) {
  if (a.rows == 0 || a.cols == 0) return cudaSuccess;
  const int threads = block_threads(cfg.threads, kMaxThreads);
  if (threads & (threads - 1)) return cudaErrorInvalidValue;  // the tree needs a power of two
  const size_t smem = sizeof(OnlineState) * TreeReduce::smem_states(threads);
  return dispatch_dtype(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch(two_pass_block_kernel<T, TreeReduce>, grid_of(a.rows), dim3(threads), smem, stream, 1, a);
  });
}

}  // namespace softmax
}  // namespace tiled_attn
