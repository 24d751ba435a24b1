// flash_fwd_sm90_launch.cuh: the host launchers of flash_fwd_sm90_kernel and of the warp-specialized
// flash_fwd_sm90_ws_kernel (with its TMA tensor maps). Included only by the flash_fwd_sm90_hdim*.cu
// files (one head dim each, both dtypes) and by the CPU emulator (which supplies launch_kernel,
// launch_ws_kernel and encode_tile_map).
#pragma once

#ifndef TILED_ATTN_EMULATION
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "../launch_common.cuh"
#include "flash_fwd_sm90_kernel.cuh"
#include "flash_fwd_sm90_ws_kernel.cuh"

namespace tiled_attn {
namespace flash_fwd_sm90 {

using flash_fwd::kMaxGridY;

template <class Tr, typename T>
cudaError_t launch_kernel(Params params, int batch_heads, cudaStream_t stream)
#ifdef TILED_ATTN_EMULATION
    ;  // tests/emulation/flash_fwd_sm90_emulator.cpp runs the CTAs on the CPU
#else
{
  const unsigned m_blocks = static_cast<unsigned>((params.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM);
  return flash_fwd::launch_sliced(flash_fwd_sm90_kernel<Tr, T>, Tr::kThreads, Tr::kSmemBytes, m_blocks,
                                  batch_heads, 1, params, stream);
}
#endif

// Head dim D, element type T (__half or __nv_bfloat16); instantiated in flash_fwd_sm90_hdim<D>.cu.
template <int kHeadDim, typename T>
cudaError_t run_flash_fwd_sm90(const Params& params, int batch_heads, cudaStream_t stream) {
  return launch_kernel<Traits<kHeadDim>, T>(params, batch_heads, stream);
}

// A 4-D tile map with 128-byte swizzle over 16-bit elements (elem_bytes 2) or float32 ones (4): dims
// innermost first (the head dim, rows, heads, batch), byte strides of dims 1..3, box = one 128-byte
// swizzle row (64 or 32 elements) x box_rows x 1 x 1. False when the driver refuses it (the caller
// reports cudaErrorInvalidValue). The driver's entry point is looked up through the runtime once (no
// link against libcuda).
inline bool encode_tile_map(CUtensorMap* map, const void* base, const uint64_t (&dims)[4],
                            const uint64_t (&strides)[3], uint32_t box_rows, uint32_t elem_bytes = 2)
#ifdef TILED_ATTN_EMULATION
    ;
#else
{
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return false;
  const cuuint64_t dim[4] = {dims[0], dims[1], dims[2], dims[3]};
  const cuuint64_t stride[3] = {strides[0], strides[1], strides[2]};
  const cuuint32_t boxes[4] = {128 / elem_bytes, box_rows, 1, 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  // A load only sizes the elements by the type (no conversion, zero fill out of bounds): fp16 for both
  // 16-bit types. A reduce-add adds in it: float32 for the backward's dQ accumulator.
  const CUtensorMapDataType type = elem_bytes == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode(map, type, 4, const_cast<void*>(base), dim, stride, boxes, unit,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}
#endif

// The map of one (B, H, N, D) operand (element strides batch / head / seq, D contiguous) of 16-bit
// elements, or (elem_bytes 4) float32. A stride of a dimension of size 1 is never used; it is replaced
// by the packed one so the map's rule (multiples of 16 bytes) holds for any view.
inline bool encode_operand(CUtensorMap* map, const void* base, int64_t batch, int64_t heads, int64_t rows,
                           int64_t d, int64_t s_batch, int64_t s_head, int64_t s_seq, uint32_t box_rows,
                           uint32_t elem_bytes = 2) {
  const int64_t seq = rows > 1 ? s_seq : d;
  const int64_t head = heads > 1 ? s_head : seq * rows;
  const int64_t bat = batch > 1 ? s_batch : head * heads;
  const uint64_t dims[4] = {static_cast<uint64_t>(d), static_cast<uint64_t>(rows), static_cast<uint64_t>(heads),
                            static_cast<uint64_t>(batch)};
  const uint64_t strides[3] = {static_cast<uint64_t>(seq) * elem_bytes, static_cast<uint64_t>(head) * elem_bytes,
                               static_cast<uint64_t>(bat) * elem_bytes};
  return encode_tile_map(map, base, dims, strides, box_rows, elem_bytes);
}

// The persistent kernel's schedule (WsSchedule) over the m_blocks x slots query tiles: sections of
// as many (batch, head) pairs as have K and V (16-bit, Nk x head_dim each, shared by a GQA group) in
// half of l2_bytes, at least one.
inline WsSchedule ws_schedule(const Params& params, int64_t m_blocks, int64_t slots, int head_dim,
                              int64_t l2_bytes) {
  const int64_t kv_bytes = int64_t{params.seqlen_k} * head_dim * 2 * 2;
  const int group = params.group;
  WsSchedule s;
  s.counter = nullptr;
  s.m_blocks = static_cast<int>(m_blocks);
  s.slots = static_cast<int>(slots);
  s.tiles = m_blocks * slots;
  const int64_t kv_heads = std::max<int64_t>(1, l2_bytes / 2 / std::max<int64_t>(1, kv_bytes));
  s.section = static_cast<int>(std::min<int64_t>(slots, kv_heads * group));
  return s;
}

// The schedule of a tile shape: with WsTraits::kLocalOrder sections of one KV head's pairs (as if the
// L2 held no more than one).
template <class Tr>
WsSchedule ws_schedule_of(const Params& params, int64_t m_blocks, int64_t slots, int64_t l2_bytes) {
  return ws_schedule(params, m_blocks, slots, Tr::kHeadDim, Tr::kLocalOrder ? 0 : l2_bytes);
}

#ifndef TILED_ATTN_EMULATION
// The current device's SM count and L2 size, read once per device (the persistent grid's size and the
// schedule's sections).
inline void device_sms_l2(int& sms, int64_t& l2_bytes) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> sm_cache[kMaxDevices], l2_cache[kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) dev = -1;
  sms = dev >= 0 ? sm_cache[dev].load(std::memory_order_relaxed) : 0;
  int l2 = dev >= 0 ? l2_cache[dev].load(std::memory_order_relaxed) : 0;
  if (sms <= 0 || l2 <= 0) {
    const int d = dev >= 0 ? dev : 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d) != cudaSuccess || sms <= 0) sms = 132;
    if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, d) != cudaSuccess || l2 <= 0) l2 = 50 << 20;
    if (dev >= 0) {
      sm_cache[dev].store(sms, std::memory_order_relaxed);
      l2_cache[dev].store(l2, std::memory_order_relaxed);
    }
  }
  l2_bytes = l2;
}
#endif

// One CTA per query tile (grid (m_blocks, pairs), sliced like every attention forward), or (persistent)
// one per SM, at most one per tile, each walking the schedule's tiles.
template <class Tr, typename T>
cudaError_t launch_ws_kernel(Params params, const TmaMaps& maps, int batch_heads, cudaStream_t stream)
#ifdef TILED_ATTN_EMULATION
    ;
#else
{
  const unsigned m_blocks = static_cast<unsigned>((params.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM);
  if constexpr (Tr::kPersistent) {
    int sms;
    int64_t l2_bytes;
    device_sms_l2(sms, l2_bytes);
    const WsSchedule sched = ws_schedule_of<Tr>(params, m_blocks, batch_heads, l2_bytes);
    if (sched.tiles == 0) return cudaSuccess;
    const auto kernel = flash_fwd_sm90_ws_kernel<Tr, T>;
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes);
    if (err != cudaSuccess) return err;
    params.bh_offset = 0;
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(sched.tiles, sms));
    if constexpr (Tr::kDynamic) {
      // The tile counter and the CTAs' picks (WsSchedule::counter): stream-ordered, so a CUDA graph
      // captures them as nodes and concurrent launches on other streams get their own. Tile indices
      // pass as int.
      if (sched.tiles > INT32_MAX) return cudaErrorInvalidValue;
      WsSchedule fed = sched;
      cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&fed.counter), (1 + grid) * sizeof(int), stream);
      if (e != cudaSuccess) return e;
      e = cudaMemsetAsync(fed.counter, 0, sizeof(int), stream);
      if (e == cudaSuccess) {
        kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(params, maps, fed);
        e = cudaGetLastError();
      }
      const cudaError_t freed = cudaFreeAsync(fed.counter, stream);
      return e != cudaSuccess ? e : freed;
    } else {
      kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(params, maps, sched);
      return cudaGetLastError();
    }
  } else {
    return flash_fwd::launch_sliced(flash_fwd_sm90_ws_kernel<Tr, T>, Tr::kThreads, Tr::kSmemBytes, m_blocks,
                                    batch_heads, 1, params, stream, maps, WsSchedule{});
  }
}
#endif

// One tile shape of the warp-specialized kernel: its three tensor maps (boxes of the tile's rows; the
// maps' inner dimension is D, so a padded tile's columns past D are zero-filled), then the launch.
// With no key at all no K or V tile is loaded (every CTA writes zeros and lse -inf), but a map needs
// every dimension >= 1: K's and V's maps are then made over Q's first row (heads_kv <= heads_q rows of
// memory that exist), never read.
template <class Tr, typename T>
cudaError_t run_ws_tile(const Params& params, int batch_heads, cudaStream_t stream) {
  const int64_t batch = batch_heads / params.heads_q, heads_kv = params.heads_q / params.group;
  constexpr int kD = Tr::kHeadDim;
  auto kv_map = [&](CUtensorMap* map, const void* base, int64_t s_batch, int64_t s_head, int64_t s_seq) {
    if (params.seqlen_k == 0)
      return encode_operand(map, params.q, batch, heads_kv, 1, kD, params.q_batch, params.q_head, params.q_seq,
                            Tr::kBlockN);
    return encode_operand(map, base, batch, heads_kv, params.seqlen_k, kD, s_batch, s_head, s_seq, Tr::kBlockN);
  };
  TmaMaps maps;
  if (!encode_operand(&maps.q, params.q, batch, params.heads_q, params.seqlen_q, kD, params.q_batch, params.q_head,
                      params.q_seq, Tr::kBlockM) ||
      !kv_map(&maps.k, params.k, params.k_batch, params.k_head, params.k_seq) ||
      !kv_map(&maps.v, params.v, params.v_batch, params.v_head, params.v_seq)) {
    return cudaErrorInvalidValue;
  }
  return launch_ws_kernel<Tr, T>(params, maps, batch_heads, stream);
}

// The warp-specialized kernel: Params as for run_flash_fwd_sm90 (make_params checked the 16-byte
// alignment of every base and stride, which is also TMA's rule), the tile by head dim (ws_consumers,
// ws_block_n, ws_split_release; up to ws_short_keys keys on ws_short_block_n's persistent tile with
// 16-byte epilogue stores, from ws_long_keys keys on ws_long_block_n, where the head dim has them), on
// the persistent grid where ws_persistent (and the short and long tiles) say so, for causal launches
// only up to ws_causal_persistent_m_blocks query tiles a head (ws_persistent: why), one CTA per tile
// otherwise.
template <int kHeadDim, typename T>
cudaError_t run_flash_fwd_sm90_ws(const Params& params, int batch_heads, cudaStream_t stream) {
  constexpr int kC = ws_consumers<kHeadDim>();
  constexpr bool kSplit = ws_split_release<kHeadDim>();
  auto persistent = [&](int block_m) {
    return !params.causal || (int64_t{params.seqlen_q} + block_m - 1) / block_m <= ws_causal_persistent_m_blocks();
  };
  if constexpr (ws_short_block_n<kHeadDim>() > 0) {
    using Short = WsTraits<kHeadDim, ws_short_block_n<kHeadDim>(), kC, kSplit, true, false, false, true>;
    if (params.seqlen_k <= ws_short_keys() && persistent(Short::kBlockM))
      return run_ws_tile<Short, T>(params, batch_heads, stream);
  }
  if constexpr (ws_long_block_n<kHeadDim>() > 0) {
    using Long = WsTraits<kHeadDim, ws_long_block_n<kHeadDim>(), kC, true, true>;
    if (params.seqlen_k >= ws_long_keys<kHeadDim>()) {
      if (persistent(Long::kBlockM)) return run_ws_tile<Long, T>(params, batch_heads, stream);
      return run_ws_tile<WsTraits<kHeadDim, Long::kBlockN, kC, true, false>, T>(params, batch_heads, stream);
    }
  }
  using Persistent = WsTraits<kHeadDim, ws_block_n<kHeadDim>(), kC, kSplit, true>;
  if constexpr (ws_persistent<kHeadDim>()) {
    if (persistent(Persistent::kBlockM)) return run_ws_tile<Persistent, T>(params, batch_heads, stream);
  }
  return run_ws_tile<WsTraits<kHeadDim, Persistent::kBlockN, kC, kSplit, false>, T>(params, batch_heads, stream);
}

}  // namespace flash_fwd_sm90
}  // namespace tiled_attn
