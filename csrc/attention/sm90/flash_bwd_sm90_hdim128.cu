// flash_bwd_sm90_hdim128.cu: the wgmma attention backward for head dim 128, fp16 and bf16 (sm_90a; one file
// per head dim so the build compiles them in parallel).
#include "flash_bwd_sm90_launch.cuh"

namespace tiled_attn {
namespace flash_fwd_sm90 {
template cudaError_t run_flash_bwd_sm90<128, __half>(const BwdParams&, const BwdOperands&, int, cudaStream_t);
template cudaError_t run_flash_bwd_sm90<128, __nv_bfloat16>(const BwdParams&, const BwdOperands&, int, cudaStream_t);
}  // namespace flash_fwd_sm90
}  // namespace tiled_attn
