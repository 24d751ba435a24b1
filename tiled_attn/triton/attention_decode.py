"""Split-KV attention for short queries against long keys (flash-decoding), plus the merge kernel.

What it adds over attention_fwd.py: (1) the M dimension of a tile packs the query rows of a whole
GQA group (row r = g·Nq + i is query i of head kv_head·G + g), so each K/V tile is read once per
group instead of once per query head; with Nq = 1 that is what makes decode bandwidth-bound rather
than bound by re-reading K/V G times. (2) The keys are split into `n_splits` ranges handled by
different programs, so B·Hkv programs (often fewer than the SMs) become enough to fill the GPU.
Each split writes its unnormalized partial (acc, m, l) to a float32 workspace (R, S, D) / (R, S),
R = B·Hq·Nq; `attention_merge_kernel` folds the S partials with `online.merge` and finalizes. With
one split the decode kernel finalizes in place and no workspace exists.

When it wins: Nq·G small (one or two M tiles) and Nk large. The wrapper picks it from the
TRITON_ATTENTION "decode" row (max_rows) and sizes S from the SM count (configs.py).
"""
import triton
import triton.language as tl

from . import online
from .attention_fwd import kv_bounds, kv_loop, load_q, tile_offsets, to_output


@triton.jit(do_not_specialize=["n_q", "n_k", "causal_offset", "m_tiles", "n_splits", "split_len"])
def attention_decode_kernel(
        Q, K, V, Out, Lse, PartAcc, PartM, PartL,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_om, stride_od,
        n_heads, group, n_q, n_k, causal_offset, qk_scale, m_tiles, n_splits, split_len,
        CAUSAL: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr,
        UPCAST: tl.constexpr, WIDE: tl.constexpr):
    # Splits of one (batch, kv head, row tile) are adjacent programs: they run together and each
    # reads a disjoint slice of the same K/V.
    pid = tl.program_id(0)
    split = pid % n_splits
    rest = pid // n_splits
    tile = rest % m_tiles
    bkv = rest // m_tiles
    n_kv_heads = n_heads // group
    b = (bkv // n_kv_heads).to(tl.int64)
    kvh = bkv % n_kv_heads

    r = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = r < group * n_q
    i = r % n_q                         # query index of the row
    h = (kvh * group + r // n_q).to(tl.int64)   # its query head
    d_ok = tl.arange(0, BLOCK_D) < HEAD_DIM
    offs_d = tl.arange(0, BLOCK_D)
    if WIDE:
        offs_d = offs_d.to(tl.int64)
    # Rows of a packed tile are not evenly spaced in memory (head and query index both vary), so
    # each row has its own 64-bit base; Q is loaded once per program, so the gather is cheap.
    q_rows = b * stride_qb + h * stride_qh + i.to(tl.int64) * stride_qm
    q = load_q(Q + q_rows[:, None] + offs_d[None, :] * stride_qd, row_ok, d_ok, EVEN_D)

    kvh64 = kvh.to(tl.int64)
    k_base = K + b * stride_kb + kvh64 * stride_kh
    v_base = V + b * stride_vb + kvh64 * stride_vh
    k_tile = tile_offsets(stride_kn, stride_kd, BLOCK_N, BLOCK_D, WIDE)
    v_tile = tile_offsets(stride_vn, stride_vd, BLOCK_N, BLOCK_D, WIDE)

    lo = split * split_len
    hi = tl.minimum(lo + split_len, n_k)
    row_first = tl.min(tl.where(row_ok, i, n_q), axis=0)
    row_last = tl.max(tl.where(row_ok, i, -1), axis=0)
    m, l = online.identity(BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    full, end = kv_bounds(lo, hi, row_first, row_last, causal_offset, CAUSAL, BLOCK_N)
    acc, m, l = kv_loop(acc, m, l, q, k_base, v_base, k_tile, v_tile, stride_kn, stride_vn, i, d_ok,
                        lo, full, n_k, causal_offset, qk_scale,
                        False, CAUSAL, BLOCK_N, EVEN_D, PRECISION, UPCAST)
    acc, m, l = kv_loop(acc, m, l, q, k_base, v_base, k_tile, v_tile, stride_kn, stride_vn, i, d_ok,
                        full, end, n_k, causal_offset, qk_scale,
                        True, CAUSAL, BLOCK_N, EVEN_D, PRECISION, UPCAST)

    # Flat (B, Hq, Nq) row index: the lse layout, and the workspace's leading dim.
    flat = (b * n_heads + h) * n_q + i
    if SPLIT:
        part = flat * n_splits + split
        tl.store(PartM + part, m, mask=row_ok)
        tl.store(PartL + part, l, mask=row_ok)
        acc_ptrs = PartAcc + part[:, None] * HEAD_DIM + offs_d[None, :]
        tl.store(acc_ptrs, acc, mask=row_ok[:, None] & d_ok[None, :])
    else:
        o_rows = b * stride_ob + h * stride_oh + i.to(tl.int64) * stride_om
        o_ptrs = Out + o_rows[:, None] + offs_d[None, :] * stride_od
        out = to_output(online.attention_out(acc, l), Out.dtype.element_ty, UPCAST)
        tl.store(o_ptrs, out, mask=row_ok[:, None] & d_ok[None, :])
        tl.store(Lse + flat, online.lse(m, l, 1.0), mask=row_ok)


@triton.jit(do_not_specialize=["n_rows", "n_q", "n_splits"])
def attention_merge_kernel(
        PartAcc, PartM, PartL, Out, Lse,
        stride_ob, stride_oh, stride_om, stride_od,
        n_rows, n_heads, n_q, n_splits,
        BLOCK_R: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
    """Merge the S partial states of BLOCK_R rows (flat (B, Hq, Nq) index) and finalize them."""
    flat = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = flat < n_rows
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    m, l = online.identity(BLOCK_R)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    for s in range(n_splits):
        part = flat * n_splits + s
        m_s = tl.load(PartM + part, mask=row_ok, other=float("-inf"))
        l_s = tl.load(PartL + part, mask=row_ok, other=0.0)
        acc_s = tl.load(PartAcc + part[:, None] * HEAD_DIM + offs_d[None, :],
                        mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        m, l, a, a_s = online.merge(m, l, m_s, l_s, 1.0)
        acc = acc * a[:, None] + acc_s * a_s[:, None]

    i = flat % n_q
    bh = flat // n_q
    o_rows = (bh // n_heads) * stride_ob + (bh % n_heads) * stride_oh + i * stride_om
    o_ptrs = Out + o_rows[:, None] + offs_d[None, :] * stride_od
    tl.store(o_ptrs, to_output(online.attention_out(acc, l), Out.dtype.element_ty, UPCAST),
             mask=row_ok[:, None] & d_ok[None, :])
    tl.store(Lse + flat, online.lse(m, l, 1.0), mask=row_ok)
