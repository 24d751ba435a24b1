"""The attention backward with a window, softcap, ALiBi, a key mask or packed sequences (varlen).

The algorithm of attention_bwd.py (delta first, then dK/dV per key tile walking the query tiles of
its GQA group, then dQ per query tile), with the score model of masks.py recomputed exactly as the
forward computed it: s = mods(q·k) in log2 units, P = exp2(s − lse), dS = P·(dP − delta), and
through softcap the chain factor 1 − tanh² (d c·tanh(x/c) / dx). The dense kernels of
attention_bwd.py stay as they are (tuned, shipped); these are separate so the common call pays
nothing for what it does not use.

Tile skipping mirrors the forward: the dK/dV kernel's query rows for a key tile [n0, last] are the
forward's key ranges with the roles swapped (query i sees key j iff j − off − right <= i <=
j − off + left), so masks.kv_ranges gives them with offset −off and the edges exchanged; the dQ
kernel walks keys as the forward does.

VARLEN: sequence b's queries are rows CuQ[b].. of the (1, H, total, D) views and its keys rows
CuK[b]..; lse and delta are (Hq, total_q). Programs past a sequence's end do nothing.
"""
import triton
import triton.language as tl

from . import masks, online
from .attention_bwd import _dot_acc, _to_dot
from .attention_fwd import to_output


@triton.jit
def _dkdv_loop_ext(dk, dv, k, v, q_src, do_src, lse_src, delta_src, stride_qm, stride_dom, q_tile, do_tile,
                   d_ok, cols, col_ok, lo, hi, n_q, offset, left, right, qk_scale, slopes, cap_in, cap_out,
                   keep, bias, MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                   BLOCK_M: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr,
                   UPCAST: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, KEY_MASK: tl.constexpr,
                   ACCURATE: tl.constexpr):
    """Fold query rows [lo, hi) of one head into (dk, dv) of the program's key tile."""
    offs_m = tl.arange(0, BLOCK_M)
    for start in range(lo, hi, BLOCK_M):
        rows = start + offs_m
        row_ok = rows < n_q
        m64 = tl.cast(start, tl.int64)
        if EVEN_D:
            ld_mask = row_ok[:, None]
        else:
            ld_mask = row_ok[:, None] & d_ok[None, :]
        q = tl.load(q_src + m64 * stride_qm + q_tile, mask=ld_mask, other=0.0)
        do = tl.load(do_src + m64 * stride_dom + do_tile, mask=ld_mask, other=0.0)
        lse = tl.load(lse_src + start + offs_m, mask=row_ok, other=float("-inf")) * online.LOG2E
        delta = tl.load(delta_src + start + offs_m, mask=row_ok, other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
            do = do.to(tl.float32)
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # [BLOCK_N, BLOCK_M]
        if SOFTCAP:
            if ACCURATE:
                s_t, t = masks.softcap(s_t, cap_in, cap_out, True)
            else:
                s_t, t = masks.softcap(s_t, cap_in, cap_out, False)
        else:
            s_t = s_t * qk_scale
        if ALIBI:
            s_t = masks.alibi(s_t, cols, rows, -offset, slopes)
        if KEY_MASK == 2:
            s_t += bias[:, None]
        p_t = online.probs(s_t, lse[None, :], 1.0)
        if KEY_MASK == 1:
            p_t = tl.where(keep[:, None], p_t, 0.0)
        if MASKED:
            # Query i sees key j iff j − off − right <= i <= j − off + left (roles exchanged).
            p_t = tl.where(masks.visible(cols, rows, row_ok, -offset, right, left, HAS_RIGHT, HAS_LEFT)
                           & col_ok[:, None], p_t, 0.0)
        dv = _dot_acc(dv, _to_dot(p_t, do.dtype, UPCAST), do, PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        if SOFTCAP:
            ds_t = ds_t * (1.0 - t * t)
        dk = _dot_acc(dk, _to_dot(ds_t, q.dtype, UPCAST), q, PRECISION)
    return dk, dv


@triton.jit(do_not_specialize=["n_q", "n_k", "offset", "left", "right", "n_tiles"])
def attention_bwd_dkdv_ext_kernel(
        Q, K, V, DO, Lse, Delta, DK, DV, Slopes, KeyMask, CuQ, CuK,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_dob, stride_doh, stride_dom, stride_dod,
        stride_dkb, stride_dkh, stride_dkn, stride_dkd,
        stride_dvb, stride_dvh, stride_dvn, stride_dvd,
        stride_sb, stride_mb, stride_mn,
        n_kv_heads, group, n_q, n_k, offset, left, right, qk_scale, sm_scale, cap_in, cap_out, n_tiles,
        HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr,
        UPCAST: tl.constexpr, WIDE: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
        KEY_MASK: tl.constexpr, VARLEN: tl.constexpr, ACCURATE: tl.constexpr):
    pid = tl.program_id(0)
    bh = pid // n_tiles
    n0 = (pid % n_tiles) * BLOCK_N
    b32 = bh // n_kv_heads
    b = b32.to(tl.int64)
    kvh = (bh % n_kv_heads).to(tl.int64)

    q_start, seq_q, k_start, seq_k, offset = masks.sequence_bounds(CuQ, CuK, CuK, b32, n_q, n_k, offset,
                                                                   VARLEN, False)
    if VARLEN:
        seq_q = tl.where(n0 < seq_k, seq_q, 0)  # a tile past the sequence's keys: no rows

    cols = n0 + tl.arange(0, BLOCK_N)
    col_ok = cols < seq_k
    offs_n = tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    if WIDE:
        offs_n = offs_n.to(tl.int64)
        offs_m = offs_m.to(tl.int64)
        d = d.to(tl.int64)
    d_ok = d < HEAD_DIM
    kv_mask = col_ok[:, None] & d_ok[None, :]
    n64 = tl.cast(k_start + n0, tl.int64)
    k = tl.load(K + b * stride_kb + kvh * stride_kh + n64 * stride_kn
                + offs_n[:, None] * stride_kn + d[None, :] * stride_kd, mask=kv_mask, other=0.0)
    v = tl.load(V + b * stride_vb + kvh * stride_vh + n64 * stride_vn
                + offs_n[:, None] * stride_vn + d[None, :] * stride_vd, mask=kv_mask, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    keep = col_ok
    bias = tl.zeros([BLOCK_N], dtype=tl.float32)
    if KEY_MASK == 1:
        keep = tl.load(KeyMask + b * stride_mb + cols * stride_mn, mask=col_ok, other=0) != 0
    elif KEY_MASK == 2:
        bias = tl.load(KeyMask + b * stride_mb + cols * stride_mn, mask=col_ok, other=0.0).to(tl.float32) \
            * masks.LOG2E
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    last = tl.minimum(n0 + BLOCK_N, seq_k) - 1
    # The forward's key ranges with queries and keys exchanged (module doc).
    start, full_lo, full_hi, end = masks.kv_ranges(0, seq_q, n0, last, -offset, right, left,
                                                   HAS_RIGHT, HAS_LEFT, BLOCK_M)
    q_tile = offs_m[:, None] * stride_qm + d[None, :] * stride_qd
    do_tile = offs_m[:, None] * stride_dom + d[None, :] * stride_dod
    n_heads = n_kv_heads * group
    q64 = tl.cast(q_start, tl.int64)
    for g in range(0, group):
        h = kvh * group + g
        q_src = Q + b * stride_qb + h * stride_qh + q64 * stride_qm
        do_src = DO + b * stride_dob + h * stride_doh + q64 * stride_dom
        if VARLEN:  # lse, delta: (Hq, total_q)
            row0 = h * n_q + q64
        else:
            row0 = (b * n_heads + h) * n_q
        slopes = tl.zeros([BLOCK_N], dtype=tl.float32)
        if ALIBI:
            slopes += tl.load(Slopes + b * stride_sb + h).to(tl.float32) * masks.LOG2E
        dk, dv = _dkdv_loop_ext(dk, dv, k, v, q_src, do_src, Lse + row0, Delta + row0, stride_qm, stride_dom,
                                q_tile, do_tile, d_ok, cols, col_ok, start, full_lo, seq_q, offset, left, right,
                                qk_scale, slopes, cap_in, cap_out, keep, bias, True, HAS_LEFT, HAS_RIGHT,
                                BLOCK_M, EVEN_D, PRECISION, UPCAST, SOFTCAP, ALIBI, KEY_MASK, ACCURATE)
        dk, dv = _dkdv_loop_ext(dk, dv, k, v, q_src, do_src, Lse + row0, Delta + row0, stride_qm, stride_dom,
                                q_tile, do_tile, d_ok, cols, col_ok, full_lo, full_hi, seq_q, offset, left, right,
                                qk_scale, slopes, cap_in, cap_out, keep, bias, False, HAS_LEFT, HAS_RIGHT,
                                BLOCK_M, EVEN_D, PRECISION, UPCAST, SOFTCAP, ALIBI, KEY_MASK, ACCURATE)
        dk, dv = _dkdv_loop_ext(dk, dv, k, v, q_src, do_src, Lse + row0, Delta + row0, stride_qm, stride_dom,
                                q_tile, do_tile, d_ok, cols, col_ok, full_hi, end, seq_q, offset, left, right,
                                qk_scale, slopes, cap_in, cap_out, keep, bias, True, HAS_LEFT, HAS_RIGHT,
                                BLOCK_M, EVEN_D, PRECISION, UPCAST, SOFTCAP, ALIBI, KEY_MASK, ACCURATE)

    dk = dk * sm_scale
    tl.store(DK + b * stride_dkb + kvh * stride_dkh + n64 * stride_dkn
             + offs_n[:, None] * stride_dkn + d[None, :] * stride_dkd,
             to_output(dk, DK.dtype.element_ty, UPCAST), mask=kv_mask)
    tl.store(DV + b * stride_dvb + kvh * stride_dvh + n64 * stride_dvn
             + offs_n[:, None] * stride_dvn + d[None, :] * stride_dvd,
             to_output(dv, DV.dtype.element_ty, UPCAST), mask=kv_mask)


@triton.jit
def _dq_loop_ext(dq, q, do, lse, delta, k_src, v_src, k_tile, v_tile, stride_kn, stride_vn, d_ok, rows,
                 lo, hi, n_k, offset, left, right, qk_scale, slopes, cap_in, cap_out, km_src, stride_mn,
                 MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, BLOCK_N: tl.constexpr,
                 EVEN_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, SOFTCAP: tl.constexpr,
                 ALIBI: tl.constexpr, KEY_MASK: tl.constexpr, ACCURATE: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        cols = start + offs_n
        key_ok = cols < n_k
        n64 = tl.cast(start, tl.int64)
        if MASKED:
            if EVEN_D:
                ld_mask = key_ok[:, None]
            else:
                ld_mask = key_ok[:, None] & d_ok[None, :]
            k = tl.load(k_src + n64 * stride_kn + k_tile, mask=ld_mask, other=0.0)
            v = tl.load(v_src + n64 * stride_vn + v_tile, mask=ld_mask, other=0.0)
        elif EVEN_D:
            k = tl.load(k_src + n64 * stride_kn + k_tile)
            v = tl.load(v_src + n64 * stride_vn + v_tile)
        else:
            k = tl.load(k_src + n64 * stride_kn + k_tile, mask=d_ok[None, :], other=0.0)
            v = tl.load(v_src + n64 * stride_vn + v_tile, mask=d_ok[None, :], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [BLOCK_M, BLOCK_N]
        if SOFTCAP:
            if ACCURATE:
                s, t = masks.softcap(s, cap_in, cap_out, True)
            else:
                s, t = masks.softcap(s, cap_in, cap_out, False)
        else:
            s = s * qk_scale
        if ALIBI:
            s = masks.alibi(s, rows, cols, offset, slopes)
        if KEY_MASK == 2:
            s += tl.load(km_src + cols * stride_mn, mask=key_ok, other=0.0).to(tl.float32)[None, :] * masks.LOG2E
        p = online.probs(s, lse[:, None], 1.0)
        if KEY_MASK == 1:
            keep = tl.load(km_src + cols * stride_mn, mask=key_ok, other=0)
            p = tl.where(keep[None, :] != 0, p, 0.0)
        if MASKED:
            p = tl.where(masks.visible(rows, cols, key_ok, offset, left, right, HAS_LEFT, HAS_RIGHT), p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = _dot_acc(dq, _to_dot(ds, k.dtype, UPCAST), k, PRECISION)
    return dq


@triton.jit(do_not_specialize=["n_q", "n_k", "offset", "left", "right", "m_tiles"])
def attention_bwd_dq_ext_kernel(
        Q, K, V, DO, Lse, Delta, DQ, Slopes, KeyMask, CuQ, CuK,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_dob, stride_doh, stride_dom, stride_dod,
        stride_dqb, stride_dqh, stride_dqm, stride_dqd,
        stride_sb, stride_mb, stride_mn,
        n_heads, group, n_q, n_k, offset, left, right, qk_scale, sm_scale, cap_in, cap_out, m_tiles,
        HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr,
        UPCAST: tl.constexpr, WIDE: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
        KEY_MASK: tl.constexpr, VARLEN: tl.constexpr, ACCURATE: tl.constexpr):
    pid = tl.program_id(0)
    bh = pid // m_tiles
    tile = pid % m_tiles
    if HAS_RIGHT and not HAS_LEFT:
        tile = m_tiles - 1 - tile
    b32 = bh // n_heads
    b = b32.to(tl.int64)
    h32 = bh % n_heads
    h = h32.to(tl.int64)
    kvh = (h32 // group).to(tl.int64)
    m0 = tile * BLOCK_M

    q_start, seq_q, k_start, seq_k, offset = masks.sequence_bounds(CuQ, CuK, CuK, b32, n_q, n_k, offset,
                                                                   VARLEN, False)
    if VARLEN:  # a tile past its sequence's end visits no key
        seq_k = tl.where(m0 < seq_q, seq_k, 0)

    rows = m0 + tl.arange(0, BLOCK_M)
    row_ok = rows < seq_q
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    if WIDE:
        offs_m = offs_m.to(tl.int64)
        offs_n = offs_n.to(tl.int64)
        d = d.to(tl.int64)
    d_ok = d < HEAD_DIM
    mask = row_ok[:, None] & d_ok[None, :]
    m64 = tl.cast(q_start + m0, tl.int64)
    q = tl.load(Q + b * stride_qb + h * stride_qh + m64 * stride_qm
                + offs_m[:, None] * stride_qm + d[None, :] * stride_qd, mask=mask, other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + m64 * stride_dom
                 + offs_m[:, None] * stride_dom + d[None, :] * stride_dod, mask=mask, other=0.0)
    if VARLEN:
        row_base = h * n_q + m64
    else:
        row_base = bh.to(tl.int64) * n_q + m0
    lse = tl.load(Lse + row_base + tl.arange(0, BLOCK_M), mask=row_ok, other=float("-inf")) * online.LOG2E
    delta = tl.load(Delta + row_base + tl.arange(0, BLOCK_M), mask=row_ok, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    slopes = tl.zeros([BLOCK_M], dtype=tl.float32)
    if ALIBI:
        slopes += tl.load(Slopes + b * stride_sb + h).to(tl.float32) * masks.LOG2E

    k64 = tl.cast(k_start, tl.int64)
    k_src = K + b * stride_kb + kvh * stride_kh + k64 * stride_kn
    v_src = V + b * stride_vb + kvh * stride_vh + k64 * stride_vn
    k_tile = offs_n[:, None] * stride_kn + d[None, :] * stride_kd
    v_tile = offs_n[:, None] * stride_vn + d[None, :] * stride_vd
    km_src = KeyMask + b * stride_mb
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    row_last = tl.minimum(m0 + BLOCK_M, seq_q) - 1
    start, full_lo, full_hi, end = masks.kv_ranges(0, seq_k, m0, row_last, offset, left, right,
                                                   HAS_LEFT, HAS_RIGHT, BLOCK_N)
    dq = _dq_loop_ext(dq, q, do, lse, delta, k_src, v_src, k_tile, v_tile, stride_kn, stride_vn, d_ok, rows,
                      start, full_lo, seq_k, offset, left, right, qk_scale, slopes, cap_in, cap_out, km_src,
                      stride_mn, True, HAS_LEFT, HAS_RIGHT, BLOCK_N, EVEN_D, PRECISION, UPCAST, SOFTCAP,
                      ALIBI, KEY_MASK, ACCURATE)
    dq = _dq_loop_ext(dq, q, do, lse, delta, k_src, v_src, k_tile, v_tile, stride_kn, stride_vn, d_ok, rows,
                      full_lo, full_hi, seq_k, offset, left, right, qk_scale, slopes, cap_in, cap_out, km_src,
                      stride_mn, False, HAS_LEFT, HAS_RIGHT, BLOCK_N, EVEN_D, PRECISION, UPCAST, SOFTCAP,
                      ALIBI, KEY_MASK, ACCURATE)
    dq = _dq_loop_ext(dq, q, do, lse, delta, k_src, v_src, k_tile, v_tile, stride_kn, stride_vn, d_ok, rows,
                      full_hi, end, seq_k, offset, left, right, qk_scale, slopes, cap_in, cap_out, km_src,
                      stride_mn, True, HAS_LEFT, HAS_RIGHT, BLOCK_N, EVEN_D, PRECISION, UPCAST, SOFTCAP,
                      ALIBI, KEY_MASK, ACCURATE)
    dq = dq * sm_scale
    tl.store(DQ + b * stride_dqb + h * stride_dqh + m64 * stride_dqm
             + offs_m[:, None] * stride_dqm + d[None, :] * stride_dqd,
             to_output(dq, DQ.dtype.element_ty, UPCAST), mask=mask)
