// softmax_emu.h: force-included (g++ -include) ahead of each csrc/softmax/*.cu so the ladder compiles,
// unchanged, for the CPU emulator (softmax_emulator.cpp). It maps the device built-ins the kernels use
// (thread/block indices, __syncthreads, __shfl_xor_sync, static and dynamic __shared__, the sm_90
// cluster API) and the one launch helper (common.cuh's launch()) onto the emulator, which runs each
// CUDA thread as a fiber: a CTA's fibers share its shared memory; a cluster's CTAs run as OS threads
// whose shared memory (thread_local) is reachable through map_shared_rank.
#pragma once

#define TILED_ATTN_EMULATION 1

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
// Round-to-nearest float arithmetic that is never fused (the host compiler contracts nothing here:
// x86-64 without -mfma has no FMA to contract into).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }

namespace emu {
const uint3& thread_idx();
const uint3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();
void syncthreads();
float shfl_xor(unsigned mask, float v, int offset);
double shfl_xor(unsigned mask, double v, int offset);
void* dynamic_smem();
unsigned cluster_rank();
unsigned cluster_size();
void cluster_sync();
void* map_shared(void* p, unsigned rank);
// Runs `body` as every thread of `grid` CTAs of `block` threads; cudaErrorInvalidValue for a launch
// a device would refuse (block size, shared memory, cluster shape), cudaErrorLaunchFailure when a
// thread faulted (the message is in last_error()).
cudaError_t launch_impl(const std::function<void()>& body, unsigned grid, dim3 block, size_t smem_bytes, int cluster);
}  // namespace emu

#define threadIdx (::emu::thread_idx())
#define blockIdx (::emu::block_idx())
#define blockDim (::emu::block_dim())
#define gridDim (::emu::grid_dim())
#define __syncthreads() ::emu::syncthreads()
#define __shfl_xor_sync(mask, v, offset) ::emu::shfl_xor((mask), (v), (offset))
#undef __shared__
#define __shared__ static thread_local
#undef __launch_bounds__
#define __launch_bounds__(...)
#define TA_DYNAMIC_SMEM(type, name) type* name = static_cast<type*>(::emu::dynamic_smem())

namespace cg {
struct cluster_group {
  unsigned block_rank() const { return ::emu::cluster_rank(); }
  unsigned num_blocks() const { return ::emu::cluster_size(); }
  void sync() const { ::emu::cluster_sync(); }
  template <typename T>
  T* map_shared_rank(T* p, unsigned rank) const {
    return static_cast<T*>(::emu::map_shared(p, rank));
  }
};
inline cluster_group this_cluster() { return {}; }
}  // namespace cg

namespace tiled_attn {
namespace softmax {
// common.cuh's launch(), on the emulator: the arguments are converted to the kernel's parameter
// types once, as a launch does, and every thread gets its own copy.
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), unsigned grid, dim3 block, size_t smem_bytes, cudaStream_t,
                   int cluster, Args&&... args) {
  const std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
  return ::emu::launch_impl([&] { std::apply(kernel, params); }, grid, block, smem_bytes, cluster);
}
}  // namespace softmax
}  // namespace tiled_attn
