// block_shuffle.cu — rung 4: rung 3 with the trees replaced by warp shuffles: each warp all-reduces
// its 32 states in registers (shfl_xor butterflies, max then sum, no barrier), one state per warp
// goes through shared memory and is reduced the same way. Two barriers per row instead of
// 2·log2(threads) + 2. Still reads x twice with scalar loads; wins over rung 3 everywhere, loses to
// the cached rungs below.
#include "common.cuh"

namespace tiled_attn {
namespace softmax {
namespace {

struct ShuffleReduce {
  static int smem_states(int) { return kWarpSize; }

  static __device__ __forceinline__ OnlineState allreduce(OnlineState s, OnlineState* smem) {
    return block_allreduce(s, smem, blockDim.x / kWarpSize);
  }
};

}  // namespace

cudaError_t forward_block_shuffle(const ForwardArgs& a, const LaunchConfig& cfg, void*, cudaStream_t stream) {
  if (a.rows == 0 || a.cols == 0) return cudaSuccess;
  const int threads = block_threads(cfg.threads, kMaxThreads);
  const size_t smem = sizeof(OnlineState) * ShuffleReduce::smem_states(threads);
  return dispatch_dtype(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch(two_pass_block_kernel<T, ShuffleReduce>, grid_of(a.rows), dim3(threads), smem, stream, 1, a);
  });
}

}  // namespace softmax
}  // namespace tiled_attn
