"""Merge two finished attention results over disjoint key sets into the first, in one pass.

Context parallelism's ring (tiled_attn/distributed.py) attends this rank's queries to one K/V shard
per step and folds each step's (out, lse) into a float32 accumulator. A finished result is the
online state (m = lse, l = 1; l = 0 where lse = −inf, a row that saw no key) with the accumulator
out, so the fold is online.merge of two such states, then online.attention_out and online.lse:

    m = max(lse_a, lse_b),  a = e^(lse_a − m),  b = e^(lse_b − m),  l = a·[lse_a > −inf] + b·[lse_b > −inf]
    out = (out_a·a + out_b·b) / l,  lse = m + ln l          (out 0 and lse −inf where l = 0)

reference.merge_attention_outputs is the same merge in torch. There it is about a dozen elementwise
kernels over (B, H, N, D) float32, each a full round trip through memory; here it is one: read the
accumulator and the new partial, write the accumulator (10 bytes an element for a 16-bit partial
and a float32 accumulator). States are in natural-log units, so the verbs run with ACCURATE (scale =
LOG2E): e^d as CUDA's expf computes it, an IEEE division, and lse = fma(m, 1, ln l) (LOG2E·ln 2 is
1.0 in float32), one rounding: the merge adds no error beyond the torch form's.
"""
import triton
import triton.language as tl

from . import online


@triton.jit(do_not_specialize=["n_q"])
def merge_outputs_kernel(
        Acc, AccLse, Part, PartLse,
        s_ab, s_ah, s_am, s_ad, s_lab, s_lah, s_lam,
        s_pb, s_ph, s_pm, s_pd, s_lpb, s_lph, s_lpm,
        n_heads, n_q,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """Acc (B, H, n_q, HEAD_DIM) and AccLse (B, H, n_q) become the merge of themselves with Part and
    PartLse (the same shapes, any strides; Part in any float dtype). Grid (cdiv(n_q, BLOCK_M), B·H)."""
    bh = tl.program_id(1)
    b, h = (bh // n_heads).to(tl.int64), (bh % n_heads).to(tl.int64)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    row_ok = rows < n_q
    ok = row_ok[:, None] & (cols < HEAD_DIM)[None, :]

    a_lse = AccLse + b * s_lab + h * s_lah + rows * s_lam
    p_lse = PartLse + b * s_lpb + h * s_lph + rows * s_lpm
    m_a = tl.load(a_lse, mask=row_ok, other=float("-inf")).to(tl.float32)
    m_p = tl.load(p_lse, mask=row_ok, other=float("-inf")).to(tl.float32)
    # a finished state: m = lse, l = 1, or the identity (−inf, 0) for a row that saw no key
    l_a = tl.where(m_a == float("-inf"), 0.0, 1.0)
    l_p = tl.where(m_p == float("-inf"), 0.0, 1.0)
    m, l, alpha_a, alpha_p = online.merge(m_a, l_a, m_p, l_p, online.LOG2E, ACCURATE=True)

    a_ptr = Acc + b * s_ab + h * s_ah + rows[:, None] * s_am + cols[None, :] * s_ad
    p_ptr = Part + b * s_pb + h * s_ph + rows[:, None] * s_pm + cols[None, :] * s_pd
    acc = (tl.load(a_ptr, mask=ok, other=0.0).to(tl.float32) * alpha_a[:, None]
           + tl.load(p_ptr, mask=ok, other=0.0).to(tl.float32) * alpha_p[:, None])
    tl.store(a_ptr, online.attention_out(acc, l, ACCURATE=True).to(Acc.dtype.element_ty), mask=ok)
    tl.store(a_lse, online.lse(m, l, online.LOG2E, ACCURATE=True).to(AccLse.dtype.element_ty), mask=row_ok)
