// block_smem_tree.cu — rung 3: one block per row. Each thread folds a strided slice of the row
// (consecutive threads, consecutive columns: coalesced), then the block reduces its states with
// shared-memory trees, log2(threads) steps each behind a barrier. The first rung that puts more than
// one thread on a row, so it wins over rungs 1-2 as soon as rows are long or few.
#include "common.cuh"

namespace tiled_attn {
namespace softmax {
namespace {

// Block size: a power of two (the tree halves it each step). smem holds blockDim.x states. Two trees
// over the same slots, the max first, then every thread's l taken against it (one rescale) and
// summed in double (a slot is 8 bytes either way): a tree of merges would rescale a partial sum at
// every level its max moved, each time with an exponential's error, and round the sum at every
// level (the error budget in ../online_softmax.cuh). Twice the barriers of one tree; this rung's
// point is the tree, not its speed.
struct TreeReduce {
  static int smem_states(int threads) { return threads; }

  static __device__ __forceinline__ OnlineState allreduce(OnlineState s, OnlineState* smem) {
    static_assert(sizeof(OnlineState) == sizeof(double), "a slot holds a state or a double");
    const int tid = threadIdx.x;
    smem[tid].m = s.m;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
      // Thread tid alone writes slot tid; slot tid + stride was last written before the barrier.
      if (tid < stride) smem[tid].m = fmaxf(smem[tid].m, smem[tid + stride].m);
      __syncthreads();
    }
    const float m = smem[0].m;
    __syncthreads();  // every thread has read slot 0's max before the slots turn into sums
    double* sums = reinterpret_cast<double*>(smem);
    sums[tid] = s.l_at(m);
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
      if (tid < stride) sums[tid] += sums[tid + stride];
      __syncthreads();
    }
    s = {m, static_cast<float>(sums[0])};
    __syncthreads();  // every thread has read slot 0 before the next row overwrites it
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
