// flash_bwd_sm90_launch.cuh: the host launcher of flash_bwd_sm90_kernel (its five TMA tensor maps, then
// the grid). Included by the flash_bwd_sm90_hdim*.cu files (one head dim each, both dtypes) and by the
// CPU emulator (which supplies launch_bwd_kernel and encode_tile_map).
#pragma once

#include "flash_bwd_sm90_kernel.cuh"
#include "flash_fwd_sm90_launch.cuh"

namespace tiled_attn {
namespace flash_fwd_sm90 {

// Grid: x = the key tiles (kBlockN keys each), y = the (batch, kv head) slots in slices of kMaxGridY.
template <class Tr, typename T>
cudaError_t launch_bwd_kernel(BwdParams params, const BwdMaps& maps, int64_t slots, cudaStream_t stream)
#ifdef TILED_ATTN_EMULATION
    ;
#else
{
  const unsigned n_blocks = static_cast<unsigned>((params.seqlen_k + Tr::kBlockN - 1) / Tr::kBlockN);
  return flash_fwd::launch_sliced(flash_bwd_sm90_kernel<Tr, T>, Tr::kThreads, Tr::kSmemBytes, n_blocks, slots, 1,
                                  params, stream, maps);
}
#endif

// One tile: the maps (Q and dO in boxes of kBlockM rows, K and V of kBlockN, dQ's accumulator in
// boxes of 64 rows: one consumer's share), then the launch over B·Hkv·kv_split slots (the virtual
// heads).
template <class Tr, typename T>
cudaError_t run_bwd_tile(const BwdParams& params, const BwdOperands& a, cudaStream_t stream) {
  constexpr int kHeadDim = Tr::kHeadDim;
  BwdMaps maps;
  if (!encode_operand(&maps.q, a.q, a.batch, params.heads_q, params.seqlen_q, kHeadDim, a.q_stride.batch,
                      a.q_stride.head, a.q_stride.seq, Tr::kBlockM) ||
      !encode_operand(&maps.dout, a.dout, a.batch, params.heads_q, params.seqlen_q, kHeadDim, a.do_stride.batch,
                      a.do_stride.head, a.do_stride.seq, Tr::kBlockM) ||
      !encode_operand(&maps.k, a.k, a.batch, a.heads_kv, params.seqlen_k, kHeadDim, a.k_stride.batch,
                      a.k_stride.head, a.k_stride.seq, Tr::kBlockN) ||
      !encode_operand(&maps.v, a.v, a.batch, a.heads_kv, params.seqlen_k, kHeadDim, a.v_stride.batch,
                      a.v_stride.head, a.v_stride.seq, Tr::kBlockN)) {
    return cudaErrorInvalidValue;
  }
  // dq_accum: (B·Hq, Nq, D) contiguous float32.
  const int64_t dq_head = int64_t{params.seqlen_q} * kHeadDim;
  if (!encode_operand(&maps.dq, params.dq_accum, a.batch, params.heads_q, params.seqlen_q, kHeadDim,
                      dq_head * params.heads_q, dq_head, kHeadDim, 64, 4)) {
    return cudaErrorInvalidValue;
  }
  return launch_bwd_kernel<Tr, T>(params, maps, a.batch * params.heads_kv, stream);  // virtual heads
}

// Head dim D, element type T, block_m query rows per step (64, or 128 at D = 64; the entry checked it).
// Instantiated in flash_bwd_sm90_hdim<D>.cu.
template <int kHeadDim, typename T>
cudaError_t run_flash_bwd_sm90(const BwdParams& params, const BwdOperands& a, int block_m, cudaStream_t stream) {
  if constexpr (kHeadDim == 64) {
    if (block_m == 128) return run_bwd_tile<BwdTraits<64, 128>, T>(params, a, stream);
  }
  return run_bwd_tile<BwdTraits<kHeadDim, 64>, T>(params, a, stream);
}

}  // namespace flash_fwd_sm90
}  // namespace tiled_attn
