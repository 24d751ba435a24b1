"""Attention backward (issue 13): forward + backward and the backward alone, bf16, B·N = 16k tokens
of H·D = 2048, and a GQA layer of the Llama-3.2-1B shape, against each SDPA backend (the default is
cuDNN on the H100) and FlexAttention."""
from . import harness as h

TOKENS, HIDDEN = 16384, 2048


def _shape(n, d, causal, mode):
    return dict(B=TOKENS // n, H=HIDDEN // d, N=n, D=d, causal=causal, mode=mode,
                panel=f"MHA D={d}{' causal' if causal else ''}")


# One layer of the Llama-3.2-1B shape (32 query / 8 kv heads, D = 64, causal, batch 1): the e2e
# training step's attention, where the kv heads' grid is about one CTA per SM.
GQA = [dict(B=1, H=32, Hkv=8, N=n, D=64, causal=True, mode=m, panel="GQA 32/8 D=64 B=1")
       for m in ("fwd+bwd", "bwd") for n in (2048, 8192)]
SHAPES = [_shape(n, d, c, m) for m in ("fwd+bwd", "bwd") for c in (False, True) for d in (64, 128)
          for n in (1024, 4096, 16384)] + GQA
QUICK = [_shape(4096, d, c, "fwd+bwd") for c in (False, True) for d in (64, 128)]

SUITE = h.Suite(
    name="attention_backward", title="Attention forward + backward vs SDPA backends and FlexAttention",
    op=h.ATTENTION_BACKWARD, device="cuda", shapes=SHAPES, quick_shapes=QUICK, dtypes=("bf16",),
    providers=[h.ours_attention_grad(None), h.ours_attention_grad("triton"), h.ours_attention_grad("cuda"),
               h.sdpa_grad(),
               h.sdpa_grad("flash"), h.sdpa_grad("cudnn"), h.sdpa_grad("efficient"), h.flex_attention_grad()],
    baselines=("sdpa", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "flex"),
    plot=h.Plot("lines", x="N", rows="mode", cols="panel"),
    notes="Gradients of a random dO by torch.autograd.grad. 'fwd+bwd' times the forward and the "
          "backward; 'bwd' the backward alone, of a forward made once per input set (retain_graph). "
          "Checked before timing: dq, dk, dv against float64 autograd through the reference "
          "(float32, chunked per head, above 2^30 score elements), each under the 2x rule against "
          "SDPA's own bf16 gradients. Eager timing only (autograd is not CUDA-graph captured here). "
          "backend='cuda' runs its wgmma forward and, on an H100 at D = 64 / 128, its wgmma backward "
          "(csrc/attention/sm90/flash_bwd_sm90_kernel.cuh; the Triton backward elsewhere). Flex's 'bwd' "
          "line is a compile of its own without donated buffers (AOTAutograd refuses to run a "
          "backward that donates its saved buffers twice on one retained graph).",
)
