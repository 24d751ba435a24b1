"""kvcache (issue 15): decode (Nq=1) and 4-token speculative decode (Nq=4, causal) against a KV
cache, contiguous and paged (page sizes 16/64/256, shuffled block tables), GQA 32/8, D=128, bf16;
memory-bound, so GB/s of K/V read against SDPA on the contiguous cache."""
from . import harness as h


def _shape(b, nq, nk):
    return dict(B=b, Nq=nq, Nk=nk, Hq=32, Hkv=8, D=128)


SHAPES = [_shape(b, nq, nk) for nq in (1, 4) for b in (1, 8, 32) for nk in (4096, 32768)]
QUICK = [_shape(b, nq, 32768) for nq in (1, 4) for b in (1, 8)]

SUITE = h.Suite(
    name="kvcache", title="KV-cache decode: paged vs contiguous (GQA 32/8, D=128) vs SDPA",
    op=h.KVCACHE, device="cuda", shapes=SHAPES, quick_shapes=QUICK, dtypes=("bf16",),
    providers=[h.kvcache_attention(), h.kvcache_attention(16), h.kvcache_attention(64),
               h.kvcache_attention(256), h.kvcache_dense(), h.kvcache_sdpa()],
    baselines=("contiguous", "sdpa"),
    plot=h.Plot("bars"),
    notes="contiguous: ta.attention_kvcache on a (B, Nk, Hkv, D) cache, cache_seqlens = Nk for "
          "every row; paged-P: the same keys in a pool of (B·Nk/P, P, Hkv, D) pages reached "
          "through a shuffled (B, Nk/P) int32 block table (bar: paged >= 0.95x contiguous at "
          "P >= 64). dense: ta.attention (our plain decode kernel) on the contiguous cache's "
          "(B, Hkv, Nk, D) view. sdpa: F.scaled_dot_product_attention on that view, enable_gqa, "
          "bottom-right causal (torch.nn.attention.bias.causal_lower_right) for Nq = 4. No "
          "append (k_new) is timed. Input sets rotate by one layout's bytes (Op.read_bytes). The "
          "eager headline is what a user's call costs: signature checks once per plan, the "
          "values of cache_seqlens and block_table read back once per tensor and version (a "
          "decode step that advances cache_seqlens in place pays one read-back, in its first "
          "layer), so in this steady state none; the CUDA-graph column is the kernel time.",
)
