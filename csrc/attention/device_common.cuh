// device_common.cuh: the device helpers both attention forwards (flash_fwd_kernel.cuh, mma.sync;
// sm90/flash_fwd_sm90_kernel.cuh, wgmma) and the split-KV merge (attention_merge.cuh) share: the
// cp.async wrappers and the float -> 16-bit pair packing. Under TILED_ATTN_EMULATION the CPU emulators
// (tests/emulation/) define smem_u32 and the cp_async_* names themselves, with their own checks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace tiled_attn {
namespace flash_fwd {

#ifndef TILED_ATTN_EMULATION
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared, bypassing L1 (.cg: K/V are reused across CTAs through L2, not
// within one). src-size 0 writes 16 zero bytes without reading `src`: the ragged rows past N.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(pred ? 16 : 0));
}
// The same for a row known to lie inside the tensor: no src-size operand, no predicate to form.
__device__ __forceinline__ void cp_async_16_full(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Wait until at most N of this thread's commit groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#endif  // TILED_ATTN_EMULATION

// Two floats rounded to T and packed low-to-high: `lo` is the lower column (k) index, as the mma and
// wgmma A fragments and a 4-byte store of adjacent columns expect.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same<T, __half>::value) {
    __half2 v = __floats2half2_rn(lo, hi);
    return reinterpret_cast<uint32_t&>(v);
  } else {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return reinterpret_cast<uint32_t&>(v);
  }
}

__device__ __forceinline__ int64_t clamp64(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

}  // namespace flash_fwd
}  // namespace tiled_attn
