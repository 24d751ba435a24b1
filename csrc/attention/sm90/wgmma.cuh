// wgmma.cuh: the sm_90a PTX the wgmma attention kernels (flash_fwd_sm90_kernel.cuh, flash_bwd_sm90_kernel.cuh)
// need, one wrapper each: warpgroup MMA (wgmma.mma_async m64nNk16, f32 accumulate, fp16/bf16 inputs) with A from shared
// memory or from registers, its fence / commit_group / wait_group, the shared-memory matrix descriptor,
// the generic-to-async proxy fence, and cp.async / shared loads and stores by shared-space address.
// Under TILED_ATTN_EMULATION none of this is compiled: tests/emulation/flash_fwd_sm90_emulator.cpp
// defines the same names from the PTX ISA's own description and runs the kernel on the CPU.
//
// PTX ISA facts used (section "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"):
//  * wgmma.mma_async is issued by the 128 threads of a warpgroup together; it reads its shared-memory
//    operands through the async proxy, so data written there by the generic proxy (st.shared, cp.async)
//    must be published with fence.proxy.async.shared::cta (then a barrier, for other threads' data).
//  * wgmma.fence orders earlier register accesses before the wgmma that reads those registers (the
//    accumulator, and the A fragment when A comes from registers); chaining wgmmas on one accumulator
//    needs none in between. The accumulator and A registers must not be touched until
//    wgmma.wait_group says the group completed. The compiler does not know that: fence_operands puts
//    an empty asm with "+f"/"+r" on each such register right after the wait and right before the
//    issue, so no access is moved across either point (CUTLASS's warpgroup_fence_operand).
//  * Shared-memory matrix descriptor (64 bits): start address >> 4 in bits 0-13, leading-dimension
//    byte offset >> 4 in 16-29, stride-dimension byte offset >> 4 in 32-45, base offset in 49-51 (0
//    here: every swizzle atom is 1024-byte aligned), swizzle mode in 62-63 (1 = 128-byte).
//  * Register fragments of m64nNk16 (warp w of the warpgroup owns rows 16w..16w+15; g = lane / 4,
//    t = lane % 4): accumulator register i holds row 16w + g + 8·((i / 2) % 2), column
//    8·(i / 4) + 2t + i % 2; the A fragment (4 x .b32, two 16-bit values each, lower k in the low
//    half) holds a0 = (row g, k 2t..2t+1), a1 = (row g+8, k 2t..), a2 = (row g, k 2t+8..),
//    a3 = (row g+8, k 2t+8..), rows relative to 16w.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../device_common.cuh"

namespace tiled_attn {
namespace flash_fwd_sm90 {

// A shared-memory matrix descriptor with 128-byte swizzle. `addr`: shared-space byte address of the
// first element; lbo / sbo in bytes (multiples of 16).
__host__ __device__ __forceinline__ uint64_t make_desc_sw128(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32) | (uint64_t{1} << 62);
}

#ifndef TILED_ATTN_EMULATION
// The cp.async wrappers of device_common.cuh (the sm90 emulator defines these names in this namespace).
using flash_fwd::cp_async_16;
using flash_fwd::cp_async_16_full;
using flash_fwd::cp_async_commit;
using flash_fwd::cp_async_wait;
using flash_fwd::smem_u32;
// This thread's completed generic-proxy writes to shared memory become visible to the async proxy
// (wgmma's operand reads).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared_f32x2(uint32_t addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void st_shared_f32x4(uint32_t addr, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
__device__ __forceinline__ uint4 ld_shared_b128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// bar.sync on a named barrier (1..15; 0 is __syncthreads') for `threads` threads (a multiple of 32):
// the backward's two consumer warpgroups meet there without the producer warpgroup, and each consumer
// with the dQ writer warp.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// bar.arrive: counts this warp's threads into the barrier's phase without waiting for it (the forward's
// consumer ping-pong: a warpgroup hands the tensor cores on to the next one, whose bar.sync waits; the
// backward's dQ hand-off). The data the backward hands over this way are shared-memory writes fenced
// for the async proxy and read by a TMA reduce issued after the bar.sync (FA3's pattern); generic data
// goes through bar.sync phases only: compute-sanitizer's racecheck reported a generic store before a
// bar.arrive and a generic load after its phase's bar.sync as a hazard (H200, session 30).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ float2 ld_shared_f32x2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

template <int N>
__device__ __forceinline__ void fence_operands(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_operands(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}: Wgmma<N, T>::ss (A from a descriptor, K-major)
// and ::rs (A from registers); scale_d = 0 ignores the accumulator's input (D = A·B), tnsp_b: B is
// MN-major. One specialization per (N, T) from TILED_ATTN_WGMMA below: inline PTX names every
// accumulator register, so the N/2 operands are spelled out in blocks of eight (TILED_ATTN_WGMMA_D8_<b>:
// the "+f" operands 8b..8b+7, _L8_<b>: their %-numbers), TILED_ATTN_WGMMA_D<REGS> / _L<REGS> chain the
// first REGS / 8 blocks, and the operand numbers after them are given as strings. N: the key tiles
// (flash_fwd_sm90_ws_traits.cuh and the sweep's kWs rows) and the tiles' widths (64, 128, 192, 256).
template <int N, typename T>
struct Wgmma;

#define TILED_ATTN_WGMMA_D8_0 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), \
    "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define TILED_ATTN_WGMMA_D8_1 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), \
    "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define TILED_ATTN_WGMMA_D8_2 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), \
    "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
#define TILED_ATTN_WGMMA_D8_3 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
    "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define TILED_ATTN_WGMMA_D8_4 "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), \
    "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
#define TILED_ATTN_WGMMA_D8_5 "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
    "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
#define TILED_ATTN_WGMMA_D8_6 "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), \
    "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])
#define TILED_ATTN_WGMMA_D8_7 "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), \
    "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define TILED_ATTN_WGMMA_D8_8 "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), \
    "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71])
#define TILED_ATTN_WGMMA_D8_9 "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), \
    "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
#define TILED_ATTN_WGMMA_D8_10 "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), \
    "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
#define TILED_ATTN_WGMMA_D8_11 "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), \
    "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
#define TILED_ATTN_WGMMA_D8_12 "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), \
    "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103])
#define TILED_ATTN_WGMMA_D8_13 "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), \
    "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111])
#define TILED_ATTN_WGMMA_D8_14 "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), \
    "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119])
#define TILED_ATTN_WGMMA_D8_15 "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), \
    "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define TILED_ATTN_WGMMA_L8_0 "%0, %1, %2, %3, %4, %5, %6, %7"
#define TILED_ATTN_WGMMA_L8_1 "%8, %9, %10, %11, %12, %13, %14, %15"
#define TILED_ATTN_WGMMA_L8_2 "%16, %17, %18, %19, %20, %21, %22, %23"
#define TILED_ATTN_WGMMA_L8_3 "%24, %25, %26, %27, %28, %29, %30, %31"
#define TILED_ATTN_WGMMA_L8_4 "%32, %33, %34, %35, %36, %37, %38, %39"
#define TILED_ATTN_WGMMA_L8_5 "%40, %41, %42, %43, %44, %45, %46, %47"
#define TILED_ATTN_WGMMA_L8_6 "%48, %49, %50, %51, %52, %53, %54, %55"
#define TILED_ATTN_WGMMA_L8_7 "%56, %57, %58, %59, %60, %61, %62, %63"
#define TILED_ATTN_WGMMA_L8_8 "%64, %65, %66, %67, %68, %69, %70, %71"
#define TILED_ATTN_WGMMA_L8_9 "%72, %73, %74, %75, %76, %77, %78, %79"
#define TILED_ATTN_WGMMA_L8_10 "%80, %81, %82, %83, %84, %85, %86, %87"
#define TILED_ATTN_WGMMA_L8_11 "%88, %89, %90, %91, %92, %93, %94, %95"
#define TILED_ATTN_WGMMA_L8_12 "%96, %97, %98, %99, %100, %101, %102, %103"
#define TILED_ATTN_WGMMA_L8_13 "%104, %105, %106, %107, %108, %109, %110, %111"
#define TILED_ATTN_WGMMA_L8_14 "%112, %113, %114, %115, %116, %117, %118, %119"
#define TILED_ATTN_WGMMA_L8_15 "%120, %121, %122, %123, %124, %125, %126, %127"
#define TILED_ATTN_WGMMA_D8 TILED_ATTN_WGMMA_D8_0
#define TILED_ATTN_WGMMA_L8 TILED_ATTN_WGMMA_L8_0
#define TILED_ATTN_WGMMA_D16 TILED_ATTN_WGMMA_D8, TILED_ATTN_WGMMA_D8_1
#define TILED_ATTN_WGMMA_L16 TILED_ATTN_WGMMA_L8 ", " TILED_ATTN_WGMMA_L8_1
#define TILED_ATTN_WGMMA_D24 TILED_ATTN_WGMMA_D16, TILED_ATTN_WGMMA_D8_2
#define TILED_ATTN_WGMMA_L24 TILED_ATTN_WGMMA_L16 ", " TILED_ATTN_WGMMA_L8_2
#define TILED_ATTN_WGMMA_D32 TILED_ATTN_WGMMA_D24, TILED_ATTN_WGMMA_D8_3
#define TILED_ATTN_WGMMA_L32 TILED_ATTN_WGMMA_L24 ", " TILED_ATTN_WGMMA_L8_3
#define TILED_ATTN_WGMMA_D40 TILED_ATTN_WGMMA_D32, TILED_ATTN_WGMMA_D8_4
#define TILED_ATTN_WGMMA_L40 TILED_ATTN_WGMMA_L32 ", " TILED_ATTN_WGMMA_L8_4
#define TILED_ATTN_WGMMA_D48 TILED_ATTN_WGMMA_D40, TILED_ATTN_WGMMA_D8_5
#define TILED_ATTN_WGMMA_L48 TILED_ATTN_WGMMA_L40 ", " TILED_ATTN_WGMMA_L8_5
#define TILED_ATTN_WGMMA_D56 TILED_ATTN_WGMMA_D48, TILED_ATTN_WGMMA_D8_6
#define TILED_ATTN_WGMMA_L56 TILED_ATTN_WGMMA_L48 ", " TILED_ATTN_WGMMA_L8_6
#define TILED_ATTN_WGMMA_D64 TILED_ATTN_WGMMA_D56, TILED_ATTN_WGMMA_D8_7
#define TILED_ATTN_WGMMA_L64 TILED_ATTN_WGMMA_L56 ", " TILED_ATTN_WGMMA_L8_7
#define TILED_ATTN_WGMMA_D72 TILED_ATTN_WGMMA_D64, TILED_ATTN_WGMMA_D8_8
#define TILED_ATTN_WGMMA_L72 TILED_ATTN_WGMMA_L64 ", " TILED_ATTN_WGMMA_L8_8
#define TILED_ATTN_WGMMA_D80 TILED_ATTN_WGMMA_D72, TILED_ATTN_WGMMA_D8_9
#define TILED_ATTN_WGMMA_L80 TILED_ATTN_WGMMA_L72 ", " TILED_ATTN_WGMMA_L8_9
#define TILED_ATTN_WGMMA_D88 TILED_ATTN_WGMMA_D80, TILED_ATTN_WGMMA_D8_10
#define TILED_ATTN_WGMMA_L88 TILED_ATTN_WGMMA_L80 ", " TILED_ATTN_WGMMA_L8_10
#define TILED_ATTN_WGMMA_D96 TILED_ATTN_WGMMA_D88, TILED_ATTN_WGMMA_D8_11
#define TILED_ATTN_WGMMA_L96 TILED_ATTN_WGMMA_L88 ", " TILED_ATTN_WGMMA_L8_11
#define TILED_ATTN_WGMMA_D104 TILED_ATTN_WGMMA_D96, TILED_ATTN_WGMMA_D8_12
#define TILED_ATTN_WGMMA_L104 TILED_ATTN_WGMMA_L96 ", " TILED_ATTN_WGMMA_L8_12
#define TILED_ATTN_WGMMA_D112 TILED_ATTN_WGMMA_D104, TILED_ATTN_WGMMA_D8_13
#define TILED_ATTN_WGMMA_L112 TILED_ATTN_WGMMA_L104 ", " TILED_ATTN_WGMMA_L8_13
#define TILED_ATTN_WGMMA_D120 TILED_ATTN_WGMMA_D112, TILED_ATTN_WGMMA_D8_14
#define TILED_ATTN_WGMMA_L120 TILED_ATTN_WGMMA_L112 ", " TILED_ATTN_WGMMA_L8_14
#define TILED_ATTN_WGMMA_D128 TILED_ATTN_WGMMA_D120, TILED_ATTN_WGMMA_D8_15
#define TILED_ATTN_WGMMA_L128 TILED_ATTN_WGMMA_L120 ", " TILED_ATTN_WGMMA_L8_15

// REGS accumulators per thread (N / 2); SS_*: the %-numbers of ss's operands after the accumulators
// (desc_a, desc_b, scale_d, tnsp_b, tnsp_a), RS_*: rs's (a[0..3] as one brace list, desc_b, scale_d, tnsp_b).
#define TILED_ATTN_WGMMA(N, REGS, T, TS, SS_A, SS_B, SS_S, SS_T, SS_TA, RS_A, RS_B, RS_S, RS_T)           \
  template <>                                                                                           \
  struct Wgmma<N, T> {                                                                                  \
    static constexpr int kRegs = REGS;                                                                  \
    template <int kTnspB, int kTnspA = 0>                                                               \
    static __device__ __forceinline__ void ss(float (&d)[REGS], uint64_t desc_a, uint64_t desc_b, int scale_d) { \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" SS_S ", 0;\n"                                   \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TS "." TS " " "{" TILED_ATTN_WGMMA_L##REGS "}"  \
                   ", %" SS_A ", %" SS_B ", p, 1, 1, %" SS_TA ", %" SS_T ";\n}\n"                            \
                   : TILED_ATTN_WGMMA_D##REGS                                                          \
                   : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTnspB), "n"(kTnspA));               \
    }                                                                                                   \
    template <int kTnspB>                                                                               \
    static __device__ __forceinline__ void rs(float (&d)[REGS], const uint32_t (&a)[4], uint64_t desc_b,   \
                                              int scale_d) {                                            \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" RS_S ", 0;\n"                                   \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TS "." TS " " "{" TILED_ATTN_WGMMA_L##REGS "}"  \
                   ", " RS_A ", %" RS_B ", p, 1, 1, %" RS_T ";\n}\n"                                         \
                   : TILED_ATTN_WGMMA_D##REGS                                                          \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(kTnspB));  \
    }                                                                                                   \
  };
// Both element types of one N.
#define TILED_ATTN_WGMMA_N(N, REGS, ...)                       \
  TILED_ATTN_WGMMA(N, REGS, __half, "f16", __VA_ARGS__)         \
  TILED_ATTN_WGMMA(N, REGS, __nv_bfloat16, "bf16", __VA_ARGS__)

TILED_ATTN_WGMMA_N(32, 16, "16", "17", "18", "19", "20", "{%16, %17, %18, %19}", "20", "21", "22")
TILED_ATTN_WGMMA_N(64, 32, "32", "33", "34", "35", "36", "{%32, %33, %34, %35}", "36", "37", "38")
TILED_ATTN_WGMMA_N(96, 48, "48", "49", "50", "51", "52", "{%48, %49, %50, %51}", "52", "53", "54")
TILED_ATTN_WGMMA_N(112, 56, "56", "57", "58", "59", "60", "{%56, %57, %58, %59}", "60", "61", "62")
TILED_ATTN_WGMMA_N(128, 64, "64", "65", "66", "67", "68", "{%64, %65, %66, %67}", "68", "69", "70")
TILED_ATTN_WGMMA_N(144, 72, "72", "73", "74", "75", "76", "{%72, %73, %74, %75}", "76", "77", "78")
TILED_ATTN_WGMMA_N(160, 80, "80", "81", "82", "83", "84", "{%80, %81, %82, %83}", "84", "85", "86")
TILED_ATTN_WGMMA_N(192, 96, "96", "97", "98", "99", "100", "{%96, %97, %98, %99}", "100", "101", "102")
TILED_ATTN_WGMMA_N(256, 128, "128", "129", "130", "131", "132", "{%128, %129, %130, %131}", "132", "133", "134")

#undef TILED_ATTN_WGMMA
#undef TILED_ATTN_WGMMA_N
#undef TILED_ATTN_WGMMA_D8_0
#undef TILED_ATTN_WGMMA_L8_0
#undef TILED_ATTN_WGMMA_D8_1
#undef TILED_ATTN_WGMMA_L8_1
#undef TILED_ATTN_WGMMA_D8_2
#undef TILED_ATTN_WGMMA_L8_2
#undef TILED_ATTN_WGMMA_D8_3
#undef TILED_ATTN_WGMMA_L8_3
#undef TILED_ATTN_WGMMA_D8_4
#undef TILED_ATTN_WGMMA_L8_4
#undef TILED_ATTN_WGMMA_D8_5
#undef TILED_ATTN_WGMMA_L8_5
#undef TILED_ATTN_WGMMA_D8_6
#undef TILED_ATTN_WGMMA_L8_6
#undef TILED_ATTN_WGMMA_D8_7
#undef TILED_ATTN_WGMMA_L8_7
#undef TILED_ATTN_WGMMA_D8_8
#undef TILED_ATTN_WGMMA_L8_8
#undef TILED_ATTN_WGMMA_D8_9
#undef TILED_ATTN_WGMMA_L8_9
#undef TILED_ATTN_WGMMA_D8_10
#undef TILED_ATTN_WGMMA_L8_10
#undef TILED_ATTN_WGMMA_D8_11
#undef TILED_ATTN_WGMMA_L8_11
#undef TILED_ATTN_WGMMA_D8_12
#undef TILED_ATTN_WGMMA_L8_12
#undef TILED_ATTN_WGMMA_D8_13
#undef TILED_ATTN_WGMMA_L8_13
#undef TILED_ATTN_WGMMA_D8_14
#undef TILED_ATTN_WGMMA_L8_14
#undef TILED_ATTN_WGMMA_D8_15
#undef TILED_ATTN_WGMMA_L8_15
#undef TILED_ATTN_WGMMA_D8
#undef TILED_ATTN_WGMMA_L8
#undef TILED_ATTN_WGMMA_D16
#undef TILED_ATTN_WGMMA_L16
#undef TILED_ATTN_WGMMA_D24
#undef TILED_ATTN_WGMMA_L24
#undef TILED_ATTN_WGMMA_D32
#undef TILED_ATTN_WGMMA_L32
#undef TILED_ATTN_WGMMA_D40
#undef TILED_ATTN_WGMMA_L40
#undef TILED_ATTN_WGMMA_D48
#undef TILED_ATTN_WGMMA_L48
#undef TILED_ATTN_WGMMA_D56
#undef TILED_ATTN_WGMMA_L56
#undef TILED_ATTN_WGMMA_D64
#undef TILED_ATTN_WGMMA_L64
#undef TILED_ATTN_WGMMA_D72
#undef TILED_ATTN_WGMMA_L72
#undef TILED_ATTN_WGMMA_D80
#undef TILED_ATTN_WGMMA_L80
#undef TILED_ATTN_WGMMA_D88
#undef TILED_ATTN_WGMMA_L88
#undef TILED_ATTN_WGMMA_D96
#undef TILED_ATTN_WGMMA_L96
#undef TILED_ATTN_WGMMA_D104
#undef TILED_ATTN_WGMMA_L104
#undef TILED_ATTN_WGMMA_D112
#undef TILED_ATTN_WGMMA_L112
#undef TILED_ATTN_WGMMA_D120
#undef TILED_ATTN_WGMMA_L120
#undef TILED_ATTN_WGMMA_D128
#undef TILED_ATTN_WGMMA_L128

#endif  // TILED_ATTN_EMULATION

}  // namespace flash_fwd_sm90
}  // namespace tiled_attn
