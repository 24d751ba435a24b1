// flash_fwd_sweep_entry.cu: the C entry points of the sweep library (loaded with ctypes by
// benchmarks/sweep_cuda_attention.py; no torch headers, so the sweep builds in seconds): the variant
// table, and one forward call of a variant with attention_fwd's checks (make_params).
#include <cuda_bf16.h>

#include <cstdint>
#include <utility>

#include "../flash_fwd_kernel.cuh"
#include "flash_fwd_sweep.cuh"

namespace tiled_attn {
namespace flash_fwd {

SweepFn* sweep_registry() {
  static SweepFn table[kNumSweep] = {};
  return table;
}

namespace {
struct SweepShape {
  int threads, smem_bytes;
};
template <size_t... I>
constexpr auto sweep_shapes(std::index_sequence<I...>) {
  struct Table {
    SweepShape v[sizeof...(I)];
  };
  return Table{{SweepShape{SweepTraits<static_cast<int>(I)>::kThreads, SweepTraits<static_cast<int>(I)>::kSmemBytes}...}};
}
constexpr auto kShapes = sweep_shapes(std::make_index_sequence<kNumSweep>{});
}  // namespace

}  // namespace flash_fwd
}  // namespace tiled_attn

using tiled_attn::flash_fwd::kNumSweep;
using tiled_attn::flash_fwd::kSweep;

extern "C" {

int tiled_attn_sweep_count() { return kNumSweep; }

// Fields of variant i; returns 0, or -1 for no such variant. `built`: 1 when this library holds it.
int tiled_attn_sweep_info(int i, int* head_dim, int* block_m, int* block_n, int* warps, int* stages,
                          unsigned* flags, int* min_blocks, int* threads, int* smem_bytes, int* built,
                          const char** why) {
  if (i < 0 || i >= kNumSweep) return -1;
  const auto& v = kSweep[i];
  *head_dim = v.head_dim, *block_m = v.block_m, *block_n = v.block_n, *warps = v.warps, *stages = v.stages;
  *flags = v.flags;
  *min_blocks = v.min_blocks;
  *threads = tiled_attn::flash_fwd::kShapes.v[i].threads;
  *smem_bytes = tiled_attn::flash_fwd::kShapes.v[i].smem_bytes;
  *built = tiled_attn::flash_fwd::sweep_registry()[i] != nullptr;
  *why = v.why;
  return 0;
}

// attention_fwd (attention.h) for bf16 through variant i. strides: q, k, v, out, each (batch, head,
// seq), in elements. Returns a cudaError_t (cudaErrorInvalidValue for a variant not built, a head
// dim that is not the variant's, or a scale <= 0 with flag::kFold).
int tiled_attn_sweep_fwd(int i, const void* q, const void* k, const void* v, void* out, float* lse, int64_t batch,
                         int64_t heads_q, int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k, int64_t head_dim,
                         const int64_t* strides, float scale, int causal, int64_t causal_offset, void* stream) {
  using namespace tiled_attn;
  if (i < 0 || i >= kNumSweep || flash_fwd::sweep_registry()[i] == nullptr) return cudaErrorInvalidValue;
  if (head_dim != kSweep[i].head_dim) return cudaErrorInvalidValue;
  if ((kSweep[i].flags & flash_fwd::flag::kFold) && !(scale > 0.f)) return cudaErrorInvalidValue;
  const AttnStrides qs{strides[0], strides[1], strides[2]}, ks{strides[3], strides[4], strides[5]},
      vs{strides[6], strides[7], strides[8]}, os{strides[9], strides[10], strides[11]};
  flash_fwd::Params p;
  int batch_heads;
  const cudaError_t err = flash_fwd::make_params(q, k, v, out, lse, batch, heads_q, heads_kv, seqlen_q, seqlen_k, qs,
                                                 ks, vs, os, scale, causal != 0, causal_offset, p, batch_heads);
  if (err != cudaSuccess || batch_heads == 0) return err;
  return flash_fwd::sweep_registry()[i](p, batch_heads, static_cast<cudaStream_t>(stream));
}

const char* tiled_attn_sweep_error_string(int err) { return cudaGetErrorString(static_cast<cudaError_t>(err)); }

}  // extern "C"
