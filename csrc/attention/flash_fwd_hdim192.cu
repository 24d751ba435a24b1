// flash_fwd_hdim192.cu: the attention forward kernel and its split-KV variant for head dim 192, fp16 and
// bf16 (one file per head dim so the build compiles them in parallel).
#include "flash_fwd_launch.cuh"

namespace tiled_attn {
namespace flash_fwd {
template cudaError_t run_flash_fwd<192, __half>(Params, int, cudaStream_t);
template cudaError_t run_flash_fwd<192, __nv_bfloat16>(Params, int, cudaStream_t);
template cudaError_t run_flash_fwd_split<192, __half>(Params, int, cudaStream_t);
template cudaError_t run_flash_fwd_split<192, __nv_bfloat16>(Params, int, cudaStream_t);
}  // namespace flash_fwd
}  // namespace tiled_attn
