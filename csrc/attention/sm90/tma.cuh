// tma.cuh: the sm_90a PTX the warp-specialized attention forward (flash_fwd_sm90_ws_kernel.cuh) adds to
// wgmma.cuh's: the shared-memory mbarrier, TMA tile loads (cp.async.bulk.tensor) that complete on one,
// and the warpgroup register reallocation (setmaxnreg). One wrapper each, by shared-space address.
// Under TILED_ATTN_EMULATION none of this is compiled: tests/emulation/flash_fwd_sm90_emulator.cpp
// defines the same names from the PTX ISA's description (deferred TMA completion, phases, tx counts).
//
// PTX ISA facts used (sections "mbarrier", "cp.async.bulk.tensor", "setmaxnreg"):
//  * An mbarrier (8 bytes of shared memory) counts a phase down from its expected arrival count and a
//    transaction count up and down: arrive.expect_tx adds bytes to the tx count and arrives;
//    complete_tx (done by a TMA as its bytes land) subtracts them. The phase completes when both reach
//    zero; the barrier then starts the next phase with the arrival count reset. try_wait.parity P
//    returns true once the phase of parity P has completed: on a fresh barrier (phase 0 running) a wait
//    on parity 1 succeeds at once, which is how a ring's "slot free" barriers start out free.
//  * Completing a phase releases, and a successful try_wait acquires, at CTA scope: data the TMA wrote
//    (through the async proxy) is visible to the waiter, wgmma included (also async proxy).
//  * mbarrier.init is a generic-proxy write: fence.mbarrier_init.release.cluster then a barrier make it
//    visible to the TMA unit and to the other threads before anyone uses the barrier.
//  * cp.async.bulk.tensor.4d...tile.mbarrier::complete_tx::bytes: one thread copies a box of the
//    tensor the CUtensorMap describes (coordinates innermost first) into shared memory laid out by the
//    map's swizzle; elements outside the tensor are written as zero and count toward the box's bytes.
//  * cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.bulk_group: one thread adds a box of shared
//    memory (laid out by the map's swizzle) into the tensor, element by element (float32 adds at L2);
//    elements outside the tensor are skipped. The copy reads shared memory asynchronously (async
//    proxy: the writers' fence.proxy.async, then a barrier, come first); cp.async.bulk.commit_group
//    closes the issuing thread's group and cp.async.bulk.wait_group.read N returns once all but its
//    N newest groups have finished reading their source, which may then be overwritten.
//  * setmaxnreg.{inc,dec}.sync.aligned.u32 N: all threads of a warpgroup set their register budget
//    to N (a multiple of 8 in [24, 256]); a dec frees registers of the CTA's pool for an inc elsewhere.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace tiled_attn {
namespace flash_fwd_sm90 {

#ifndef TILED_ATTN_EMULATION
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// The inits (generic proxy) become visible to the async proxy (the TMA unit's complete_tx); a barrier
// after this publishes them to the other threads.
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n"
               ::"r"(bar), "r"(bytes) : "memory");
}
// Spins until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}

// A box of `tmap` at coordinates (c0 innermost .. c3) into shared memory at `dst`, completing on `bar`.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* tmap, uint32_t bar, int c0, int c1,
                                            int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst), "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1),
      "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// Adds the box at shared `src` into `tmap`'s tensor at coordinates (c0 innermost .. c3) (bulk group).
__device__ __forceinline__ void tma_reduce_add_4d(const CUtensorMap* tmap, uint32_t src, int c0, int c1, int c2,
                                                  int c3) {
  asm volatile("cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
               ::"l"(reinterpret_cast<uint64_t>(tmap)), "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Returns once all but the newest kGroups bulk groups of this thread have read their shared source.
template <int kGroups>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kGroups) : "memory");
}

template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
#endif  // TILED_ATTN_EMULATION

}  // namespace flash_fwd_sm90
}  // namespace tiled_attn
