"""Attention forward grid (issues 6, 14): 32768 tokens (B·N) of H = 2048 // D heads (H·D = 2048; 2016 at
D = 96, 1920 at D = 192), bf16, against each SDPA backend and compiled FlexAttention."""
from . import harness as h

TOKENS, HIDDEN = 32768, 2048


def _shape(n, d, causal):
    return dict(B=TOKENS // n, H=HIDDEN // d, N=n, D=d, causal=causal)


# Issue 14's grid: head dims 64-256 (96 and 192: no cuda-wgmma, whose cp.async kernel lacks them)
# and N 512-16k.
SHAPES = [_shape(n, d, c) for c in (False, True) for d in (64, 96, 128, 192, 256)
          for n in (512, 1024, 2048, 4096, 8192, 16384)]
QUICK = [_shape(n, 128, c) for c in (False, True) for n in (2048, 8192)]

SUITE = h.Suite(
    name="attention", title="Attention forward vs SDPA backends and FlexAttention",
    op=h.ATTENTION, device="cuda", shapes=SHAPES, quick_shapes=QUICK, dtypes=("bf16",),
    providers=[h.default_attention(), h.ours_attention("triton"), h.ours_attention("cuda"),
               h.cuda_attention_kernel("wgmma"), h.cuda_attention_kernel("wgmma_ws"),
               h.sdpa(), h.sdpa("flash"), h.sdpa("cudnn"), h.sdpa("efficient"), h.flex_attention()],
    baselines=("sdpa", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "flex"),
    plot=h.Plot("lines", x="N", rows="causal", cols="D"),
    notes="SDPA backends pinned one at a time with torch.nn.attention.sdpa_kernel. FlexAttention: "
          "torch.compile(flex_attention, dynamic=False), compiled once per shape and mask in its "
          "checked first call (never timed); causal through a block mask. cuda-wgmma: backend='cuda' "
          "with the sm_90a wgmma forward forced (csrc/attention/sm90/); cuda-wgmma_ws: its "
          "warp-specialized form (a TMA producer warp, two or three consumer warpgroups, mbarrier ring). "
          "default: backend=None, which on sm90 runs cuda-wgmma_ws where configs.ATTENTION_SELECT says.",
)
