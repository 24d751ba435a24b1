"""Split-KV attention for short queries against long keys (flash-decoding), plus the merge kernel.

What it adds over attention_fwd.py: (1) the M dimension of a tile packs the query rows of a whole
GQA group (row r = g·Nq + i is query i of head kv_head·G + g), so each K/V tile is read once per
group instead of once per query head; with Nq = 1 that is what makes decode bandwidth-bound rather
than bound by re-reading K/V G times. (2) The keys are split into `n_splits` ranges handled by
different programs, so B·Hkv programs (often fewer than the SMs) become enough to fill the GPU.
Each split writes its unnormalized partial (acc, m, l) to one float32 workspace laid out
[R·S·D accumulators | R·S maxima | R·S sums], R = B·Hq·Nq rows, S splits, part index r·S + s;
`attention_merge_kernel` folds a row's S partials and finalizes. With one split the decode kernel
finalizes in place and no workspace exists.

The merge runs one program per row and loads all of the row's partials as one [BLOCK_S, BLOCK_D]
tile (online.merge_parts), so its time is one memory round trip, not one per split: a loop over
the splits (the first version) cost ~0.7 µs of load latency per split, S ≈ 33 at B = 1.

When it wins: Nq·G small (one or two M tiles) and Nk large. The wrapper picks it from the
TRITON_ATTENTION "decode" row (max_rows) and sizes S from the SM count (configs.py).
"""
import triton
import triton.language as tl

from . import masks, online
from .attention_fwd import (dk_mask, finish_scale, head_dims, k_offsets, kv_walk, page_vector, q_mask, q_offsets,
                            to_output)


@triton.jit
def decode_program(
        Q, K, V, Out, Lse, Part, Slopes, KeyMask, SeqK, BlockTable,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_om, stride_od,
        stride_sb, stride_mb, stride_mn, stride_tb, n_pages,
        n_heads, group, n_q, n_k, offset, left, right, qk_scale, cap_in, cap_out,
        m_tiles, n_splits, split_len, n_rows,
        HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
        PRECISION: tl.constexpr, UPCAST: tl.constexpr, WIDE: tl.constexpr, RAW: tl.constexpr,
        FMA: tl.constexpr, LATE_L: tl.constexpr, SPLIT_D: tl.constexpr, ACCURATE: tl.constexpr,
        ADDR: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, KEY_MASK: tl.constexpr,
        SEQ_K: tl.constexpr, PAGED: tl.constexpr, PAGE: tl.constexpr, STORE_LSE: tl.constexpr,
        PAGE_VEC: tl.constexpr):
    """One (batch, kv head, row tile, key split). SEQ_K: batch b has SeqK[b] keys (n_k is the
    capacity), aligned bottom-right (offset + SeqK[b] − Nq); PAGED, the window, SOFTCAP, ALIBI and
    KEY_MASK as in attention_fwd.fwd_program (here a tile's rows belong to several heads, so the
    ALiBi slope is per row); STORE_LSE = False: no lse is written (fwd_program). PAGE_VEC > 0
    (PAGED, pages a multiple of BLOCK_N, a split touching at most PAGE_VEC table entries): the
    split's entries are read in one load beside SeqK's, not one dependent read per key tile."""
    # Splits of one (batch, kv head, row tile) are adjacent programs: they run together and each
    # reads a disjoint slice of the same K/V.
    pid = tl.program_id(0)
    split = pid % n_splits
    rest = pid // n_splits
    tile = rest % m_tiles
    bkv = rest // m_tiles
    n_kv_heads = n_heads // group
    b32 = bkv // n_kv_heads
    b = b32.to(tl.int64)
    kvh = bkv % n_kv_heads
    if PAGED and PAGE_VEC > 0:
        # Issued before SeqK is back: with a table read per tile, the walk's first K/V copy waited
        # for SeqK and then for its page (ncu on the H200, B = 1, 4096 keys in 16 splits: that wait
        # was the paged kernel's extra ~0.9 µs over the contiguous one's 8.6).
        pages, page_e0 = page_vector(BlockTable + b * stride_tb, split * split_len, n_k // PAGE, PAGE, PAGE_VEC)
    else:
        pages, page_e0 = 0, 0

    _, _, _, seq_k, offset = masks.sequence_bounds(SeqK, SeqK, SeqK, b32, n_q, n_k, offset, False, SEQ_K)

    r = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = r < group * n_q
    i = r % n_q                         # query index of the row
    h = (kvh * group + r // n_q).to(tl.int64)   # its query head
    d = head_dims(BLOCK_D, SPLIT_D, WIDE)
    d_ok = d < HEAD_DIM
    dv = head_dims(BLOCK_D, 1, WIDE)
    dv_ok = (dv < HEAD_DIM)[None, :]
    # Rows of a packed tile are not evenly spaced in memory (head and query index both vary), so
    # each row has its own 64-bit base; Q is loaded once per program, so the gather is cheap.
    q_rows = b * stride_qb + h * stride_qh + i.to(tl.int64) * stride_qm
    q = tl.load(Q + q_offsets(q_rows, d, stride_qd, SPLIT_D), mask=q_mask(row_ok, d_ok, EVEN_D, SPLIT_D),
                other=0.0)

    kvh64 = kvh.to(tl.int64)
    if ADDR == "tma":  # K, V are tensor descriptors over (B, Hkv, Nk, D)
        k_src = K
        v_src = V
    elif PAGED:
        k_src = K + kvh64 * stride_kh
        v_src = V + kvh64 * stride_vh
    else:
        k_src = K + b * stride_kb + kvh64 * stride_kh
        v_src = V + b * stride_vb + kvh64 * stride_vh
    k_tile = k_offsets(stride_kn, d, stride_kd, BLOCK_N, SPLIT_D, WIDE)
    v_tile = k_offsets(stride_vn, dv, stride_vd, BLOCK_N, 1, WIDE)
    slopes = tl.zeros([BLOCK_M], dtype=tl.float32)
    if ALIBI:
        slopes += tl.load(Slopes + b * stride_sb + h, mask=row_ok, other=0.0).to(tl.float32) * masks.LOG2E

    # Computed here, not with the table read above: the dense decode's register allocation is the
    # one its configs were checked at (tests/test_attention.py, sm_90a: computing it at the top
    # spilled 8 bytes at float32, D = 64, causal).
    lo = split * split_len
    hi = tl.minimum(lo + split_len, seq_k)
    row_first = tl.min(tl.where(row_ok, i, n_q), axis=0)
    row_last = tl.max(tl.where(row_ok, i, -1), axis=0)
    m, l = online.identity(BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    acc, m, l, _ = kv_walk(acc, m, l, q, k_src, v_src, k_tile, v_tile, stride_kn, stride_vn, b32, kvh, 0,
                           i, dk_mask(d_ok, SPLIT_D), dv_ok, lo, hi, row_first, row_last, seq_k, offset,
                           left, right, qk_scale, slopes, cap_in, cap_out, KeyMask + b * stride_mb, stride_mn,
                           BlockTable + b * stride_tb, PAGE, n_pages, stride_kb, stride_vb, pages, page_e0,
                           acc, q, k_src, v_src, k_tile, v_tile,  # no second head-dim part
                           HAS_LEFT, HAS_RIGHT, BLOCK_N, BLOCK_D, EVEN_D, PRECISION, UPCAST, RAW, FMA, LATE_L,
                           SPLIT_D, ADDR, SOFTCAP, ALIBI, KEY_MASK, PAGED, PAGE_VEC, 0)

    # Flat (B, Hq, Nq) row index: the lse layout, and the workspace's leading dim.
    flat = (b * n_heads + h) * n_q + i
    if SPLIT:
        n_parts = n_rows.to(tl.int64) * n_splits
        part = flat * n_splits + split
        acc_ptrs = Part + part[:, None] * HEAD_DIM + dv[None, :]
        tl.store(acc_ptrs, acc, mask=row_ok[:, None] & dv_ok)
        tl.store(Part + n_parts * HEAD_DIM + part, m, mask=row_ok)
        tl.store(Part + n_parts * (HEAD_DIM + 1) + part, l, mask=row_ok)
    else:
        o_rows = b * stride_ob + h * stride_oh + i.to(tl.int64) * stride_om
        o_ptrs = Out + o_rows[:, None] + dv[None, :] * stride_od
        out = to_output(online.attention_out(acc, l, ACCURATE), Out.dtype.element_ty, UPCAST)
        tl.store(o_ptrs, out, mask=row_ok[:, None] & dv_ok)
        if STORE_LSE:
            tl.store(Lse + flat, online.lse(m, l, finish_scale(qk_scale, RAW), ACCURATE), mask=row_ok)


@triton.jit(do_not_specialize=["n_q", "n_k", "causal_offset", "m_tiles", "n_splits", "split_len", "n_rows"])
def attention_decode_kernel(
        Q, K, V, Out, Lse, Part,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_om, stride_od,
        n_heads, group, n_q, n_k, causal_offset, qk_scale, m_tiles, n_splits, split_len, n_rows,
        CAUSAL: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr,
        UPCAST: tl.constexpr, WIDE: tl.constexpr, RAW: tl.constexpr, FMA: tl.constexpr,
        LATE_L: tl.constexpr, SPLIT_D: tl.constexpr, ACCURATE: tl.constexpr, ADDR: tl.constexpr,
        STORE_LSE: tl.constexpr = True):
    """Dense split-KV decode (causal at most): the fewest launch arguments (see attention_fwd_kernel)."""
    decode_program(Q, K, V, Out, Lse, Part, Lse, Lse, Lse, Lse,
                   stride_qb, stride_qh, stride_qm, stride_qd,
                   stride_kb, stride_kh, stride_kn, stride_kd,
                   stride_vb, stride_vh, stride_vn, stride_vd,
                   stride_ob, stride_oh, stride_om, stride_od,
                   0, 0, 0, 0, 1,
                   n_heads, group, n_q, n_k, causal_offset, 0, 0, qk_scale, 1.0, 1.0,
                   m_tiles, n_splits, split_len, n_rows,
                   False, CAUSAL, SPLIT, BLOCK_M, BLOCK_N, HEAD_DIM, BLOCK_D, EVEN_D, PRECISION, UPCAST,
                   WIDE, RAW, FMA, LATE_L, SPLIT_D, ACCURATE, ADDR, False, False, 0, False, False, 1, STORE_LSE,
                   0)


@triton.jit(do_not_specialize=["n_q", "n_k", "offset", "left", "right", "m_tiles", "n_splits", "split_len",
                               "n_rows", "n_pages"])
def attention_decode_ext_kernel(
        Q, K, V, Out, Lse, Part, Slopes, KeyMask, SeqK, BlockTable,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_om, stride_od,
        stride_sb, stride_mb, stride_mn, stride_tb, n_pages,
        n_heads, group, n_q, n_k, offset, left, right, qk_scale, cap_in, cap_out,
        m_tiles, n_splits, split_len, n_rows,
        HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
        PRECISION: tl.constexpr, UPCAST: tl.constexpr, WIDE: tl.constexpr, RAW: tl.constexpr,
        FMA: tl.constexpr, LATE_L: tl.constexpr, SPLIT_D: tl.constexpr, ACCURATE: tl.constexpr,
        ADDR: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, KEY_MASK: tl.constexpr,
        SEQ_K: tl.constexpr, PAGED: tl.constexpr, PAGE: tl.constexpr, PAGE_VEC: tl.constexpr = 0,
        STORE_LSE: tl.constexpr = True):
    """Split-KV decode with a window, score modifications or a (paged) KV cache."""
    decode_program(Q, K, V, Out, Lse, Part, Slopes, KeyMask, SeqK, BlockTable,
                   stride_qb, stride_qh, stride_qm, stride_qd,
                   stride_kb, stride_kh, stride_kn, stride_kd,
                   stride_vb, stride_vh, stride_vn, stride_vd,
                   stride_ob, stride_oh, stride_om, stride_od,
                   stride_sb, stride_mb, stride_mn, stride_tb, n_pages,
                   n_heads, group, n_q, n_k, offset, left, right, qk_scale, cap_in, cap_out,
                   m_tiles, n_splits, split_len, n_rows,
                   HAS_LEFT, HAS_RIGHT, SPLIT, BLOCK_M, BLOCK_N, HEAD_DIM, BLOCK_D, EVEN_D, PRECISION,
                   UPCAST, WIDE, RAW, FMA, LATE_L, SPLIT_D, ACCURATE, ADDR, SOFTCAP, ALIBI, KEY_MASK,
                   SEQ_K, PAGED, PAGE, STORE_LSE, PAGE_VEC)


@triton.jit(do_not_specialize=["n_rows", "n_q", "n_splits"])
def attention_merge_kernel(
        Part, Out, Lse,
        stride_ob, stride_oh, stride_om, stride_od,
        n_rows, n_heads, n_q, n_splits, qk_scale,
        BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr,
        RAW: tl.constexpr, ACCURATE: tl.constexpr, STORE_LSE: tl.constexpr = True):
    """Merge the S partial states of one row (flat (B, Hq, Nq) index) and finalize it. All of a
    row's partials are one contiguous [S, D] block: loaded as [BLOCK_S, BLOCK_D] tiles (one tile
    unless S > BLOCK_S), merged with online.merge_parts."""
    flat = tl.program_id(0).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    offs_s = tl.arange(0, BLOCK_S)
    n_parts = n_rows.to(tl.int64) * n_splits
    scale = finish_scale(qk_scale, RAW)
    m, l = online.identity(1)
    acc = tl.zeros([1, BLOCK_D], dtype=tl.float32)
    for s0 in range(0, n_splits, BLOCK_S):
        s_ok = s0 + offs_s < n_splits
        part = flat * n_splits + s0 + offs_s
        m_s = tl.load(Part + n_parts * HEAD_DIM + part, mask=s_ok, other=float("-inf"))[None, :]
        l_s = tl.load(Part + n_parts * (HEAD_DIM + 1) + part, mask=s_ok, other=0.0)[None, :]
        acc_s = tl.load(Part + part[:, None] * HEAD_DIM + offs_d[None, :],
                        mask=s_ok[:, None] & d_ok[None, :], other=0.0)
        # Unused slots are the identity state (m = -inf, l = 0): weight 0.
        m_c, l_c, a_c = online.merge_parts(m_s, l_s, scale)
        acc_c = tl.sum(acc_s * tl.trans(a_c), axis=0)[None, :]
        m, l, a, a2 = online.merge(m, l, m_c, l_c, scale)
        acc = acc * a[:, None] + acc_c * a2[:, None]

    i = flat % n_q
    bh = flat // n_q
    o_base = Out + (bh // n_heads) * stride_ob + (bh % n_heads) * stride_oh + i * stride_om
    out = to_output(online.attention_out(acc, l, ACCURATE), Out.dtype.element_ty, UPCAST)
    tl.store(o_base + offs_d[None, :] * stride_od, out, mask=d_ok[None, :])
    if STORE_LSE:
        lse = online.lse(m, l, scale, ACCURATE)
        tl.store(Lse + flat + tl.arange(0, 1), lse)
