// flash_fwd_sm90_hdim256.cu: the wgmma attention forwards (cp.async and warp-specialized) for head dim
// 256, fp16 and bf16 (sm_90a; one file per head dim so the build compiles them in parallel).
#include "flash_fwd_sm90_launch.cuh"

namespace tiled_attn {
namespace flash_fwd_sm90 {
template cudaError_t run_flash_fwd_sm90<256, __half>(const Params&, int, cudaStream_t);
template cudaError_t run_flash_fwd_sm90<256, __nv_bfloat16>(const Params&, int, cudaStream_t);
template cudaError_t run_flash_fwd_sm90_ws<256, __half>(const Params&, int, cudaStream_t);
template cudaError_t run_flash_fwd_sm90_ws<256, __nv_bfloat16>(const Params&, int, cudaStream_t);
}  // namespace flash_fwd_sm90
}  // namespace tiled_attn
