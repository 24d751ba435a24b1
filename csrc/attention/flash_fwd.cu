// flash_fwd.cu: attention_fwd and attention_fwd_split (attention.h): argument checks and Params
// (make_params, make_split_params in flash_fwd.cuh), the dispatch over head dim and dtype (FwdHeadDims)
// to the instantiations in flash_fwd_hdim*.cu, and the split path's merge launch. The Python wrapper
// (tiled_attn/cuda/attention.py) has already raised a ValueError for anything rejected here; these
// checks keep a direct C++ caller from launching on bad input.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../online_softmax.cuh"
#include "attention.h"
#include "attention_merge.cuh"
#include "flash_fwd.cuh"

namespace tiled_attn {

bool attention_head_dim_supported(int64_t head_dim) { return flash_fwd::FwdHeadDims::contains(head_dim); }

cudaError_t attention_fwd(AttnDtype dtype, const void* q, const void* k, const void* v, void* out, float* lse,
                          int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k,
                          int64_t head_dim, AttnStrides q_stride, AttnStrides k_stride, AttnStrides v_stride,
                          AttnStrides o_stride, float scale, bool causal, int64_t causal_offset,
                          cudaStream_t stream) {
  return flash_fwd::FwdHeadDims::run(
      dtype, head_dim,
      [&](auto elem, auto dim, flash_fwd::Params& p, int batch_heads) {
        return flash_fwd::run_flash_fwd<decltype(dim)::value, typename decltype(elem)::type>(p, batch_heads, stream);
      },
      q, k, v, out, lse, batch, heads_q, heads_kv, seqlen_q, seqlen_k, q_stride, k_stride, v_stride, o_stride, scale,
      causal, causal_offset);
}

cudaError_t attention_fwd_split(AttnDtype dtype, const void* q, const void* k, const void* v, void* out, float* lse,
                                float* workspace, int64_t num_splits, int64_t batch, int64_t heads_q,
                                int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k, int64_t head_dim,
                                AttnStrides q_stride, AttnStrides k_stride, AttnStrides v_stride,
                                AttnStrides o_stride, float scale, bool causal, int64_t causal_offset,
                                cudaStream_t stream) {
  return flash_fwd::FwdHeadDims::run(
      dtype, head_dim,
      [&](auto elem, auto dim, flash_fwd::Params& p, int) {
        int slots;
        cudaError_t err = flash_fwd::make_split_params(workspace, num_splits, batch, heads_kv, p, slots);
        if (err != cudaSuccess) return err;
        err = flash_fwd::run_flash_fwd_split<decltype(dim)::value, typename decltype(elem)::type>(p, slots, stream);
        if (err != cudaSuccess) return err;
        flash_fwd::MergeParams mp;
        mp.partial = workspace;
        mp.out = out;
        mp.lse = lse;
        mp.o_batch = o_stride.batch, mp.o_head = o_stride.head, mp.o_seq = o_stride.seq;
        mp.rows = batch * heads_q * seqlen_q;
        mp.num_parts = p.num_parts;
        mp.heads_q = p.heads_q;
        mp.seqlen_q = p.seqlen_q;
        mp.num_splits = p.num_splits;
        return flash_fwd::run_attention_merge(dtype, head_dim, mp, stream);
      },
      q, k, v, out, lse, batch, heads_q, heads_kv, seqlen_q, seqlen_k, q_stride, k_stride, v_stride, o_stride, scale,
      causal, causal_offset);
}

}  // namespace tiled_attn
