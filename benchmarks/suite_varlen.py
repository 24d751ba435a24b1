"""varlen (issue 15): packed batches of ragged sequences, 16k tokens, GQA 32/8, bf16, against our
dense kernel on the padded batch, SDPA with the equivalent boolean mask, and FlexAttention with the
equivalent (document) block mask. TFLOP/s counted on valid (query, key) pairs for every provider."""
from . import harness as h

T = 16384


def _shape(lo, hi, d, causal):
    return dict(T=T, lo=lo, hi=hi, Hq=32, Hkv=8, D=d, causal=causal)


# ragged: lengths drawn in [128, 4096] (fixed seed, h.ragged_lengths); uniform: 8 x 2048
SEQS = ((128, 4096), (2048, 2048))
SHAPES = [_shape(lo, hi, d, c) for c in (False, True) for d in (64, 128) for lo, hi in SEQS]
QUICK = [_shape(lo, hi, 128, c) for c in (False, True) for lo, hi in SEQS]

SUITE = h.Suite(
    name="varlen", title="Varlen forward (packed ragged sequences) vs dense, SDPA and FlexAttention",
    op=h.VARLEN, device="cuda", shapes=SHAPES, quick_shapes=QUICK, dtypes=("bf16",),
    providers=[h.varlen_attention(), h.varlen_dense(), h.varlen_dense_masked(), h.varlen_sdpa(),
               h.varlen_sdpa("efficient"), h.varlen_sdpa("cudnn"), h.varlen_flex()],
    baselines=("dense", "dense-masked", "sdpa", "sdpa-efficient", "sdpa-cudnn", "flex"),
    plot=h.Plot("bars"),
    notes="Every provider computes the same attention and is counted on the same valid pairs "
          "(4·D·Hq·Σ pairs), so TFLOP/s ratios are time ratios and padded work shows as waste. "
          f"Lengths (h.ragged_lengths, seed {h.VARLEN_SEED}): ragged {h.ragged_lengths(T, 128, 4096)}, "
          f"uniform {h.ragged_lengths(T, 2048, 2048)}. default: ta.attention_varlen on the packed "
          "(T, H, D) tensors. dense: ta.attention on the right-padded (B, H, max_len, D) batch, no "
          "mask: run where that is exact (uniform, where nothing is padded: the bar's "
          "denominator, varlen >= 0.95x dense; and causal). dense-masked: our kernel with a "
          "key-padding mask on the padded batch (what ta.scaled_dot_product_attention and "
          "transformers' padded batches run). sdpa*: F.scaled_dot_product_attention on the padded "
          "batch with the (B, 1, M, M) boolean mask (valid keys, and causal), K/V repeated to Hq "
          "heads beforehand. flex: torch.compile(flex_attention) on the packed (1, H, T, D) with a "
          "document (+ causal) block mask made once per case, compiled in the checked first call "
          "(bar: varlen >= 1.0x flex). Inputs in each layout are made before timing (padding is "
          "not timed); each padded output's valid rows are gathered for the check only. The eager "
          "headline of default includes its host-side check of cu_seqlens (one device-to-host "
          "read per call); the CUDA-graph column, where it is skipped, is the kernel time.",
)
