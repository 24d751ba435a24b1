// flash_fwd_sm90_hdim192.cu: the warp-specialized wgmma attention forward for head dim 192, fp16 and
// bf16 (sm_90a). No cp.async kernel here: its tiles are whole 64-column blocks and its copies split a
// row into 16-byte chunks that its 256 threads must divide evenly (flash_fwd_sm90::Traits).
#include "flash_fwd_sm90_launch.cuh"

namespace tiled_attn {
namespace flash_fwd_sm90 {
template cudaError_t run_flash_fwd_sm90_ws<192, __half>(const Params&, int, cudaStream_t);
template cudaError_t run_flash_fwd_sm90_ws<192, __nv_bfloat16>(const Params&, int, cudaStream_t);
}  // namespace flash_fwd_sm90
}  // namespace tiled_attn
