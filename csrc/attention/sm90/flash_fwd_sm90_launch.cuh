// flash_fwd_sm90_launch.cuh: the host launchers of flash_fwd_sm90_kernel and of the warp-specialized
// flash_fwd_sm90_ws_kernel (with its TMA tensor maps). Included only by the flash_fwd_sm90_hdim*.cu
// files (one head dim each, both dtypes) and by the CPU emulator (which supplies launch_kernel,
// launch_ws_kernel and encode_tile_map).
#pragma once

#ifndef TILED_ATTN_EMULATION
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#endif

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

template <class Tr, typename T>
cudaError_t launch_ws_kernel(Params params, const TmaMaps& maps, int batch_heads, cudaStream_t stream)
#ifdef TILED_ATTN_EMULATION
    ;
#else
{
  const unsigned m_blocks = static_cast<unsigned>((params.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM);
  return flash_fwd::launch_sliced(flash_fwd_sm90_ws_kernel<Tr, T>, Tr::kThreads, Tr::kSmemBytes, m_blocks,
                                  batch_heads, 1, params, stream, maps);
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
// ws_block_n).
template <int kHeadDim, typename T>
cudaError_t run_flash_fwd_sm90_ws(const Params& params, int batch_heads, cudaStream_t stream) {
  return run_ws_tile<WsTraits<kHeadDim, ws_block_n<kHeadDim>()>, T>(params, batch_heads, stream);
}

}  // namespace flash_fwd_sm90
}  // namespace tiled_attn
