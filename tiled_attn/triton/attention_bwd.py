"""Fused attention backward (FlashAttention-2's algorithm in Triton): delta, then dK/dV, then dQ.

With P = softmax(s), s = scale·q·kᵀ, O = P·V and the forward's lse (lse = m + log l, the row's
final online-softmax state), the gradients are
    dV = Pᵀ·dO,   dP = dO·Vᵀ,   dS = P·(dP − delta),   dQ = scale·dS·K,   dK = scale·dSᵀ·Q
with delta_i = Σ_d dO_id·O_id (minus dlse_i when the caller's loss uses lse: d lse_i/d s_ij = P_ij).
P is recomputed tile by tile from q, k and lse by online.probs (the finalize of the forward's
state), never stored: the only extra memory is delta, (B, Hq, Nq) float32.

The launches:
* attention_bwd_delta_kernel: delta (one program per BLOCK_M rows of one head).
* attention_bwd_dkdv_kernel: one program per (batch, kv head, key tile). It keeps K, V, dK, dV of
  its BLOCK_N keys on chip and walks every query tile of every query head of its GQA group, so dK
  and dV are summed over the group inside the kernel (K/V are never repeated in memory) and
  written once, without atomics. It works in the transposed orientation ([BLOCK_N, BLOCK_M]
  tiles: sᵀ = k·qᵀ), so Pᵀ and dSᵀ feed the dV and dK products with no transpose of a computed tile.
* attention_bwd_dq_kernel: one program per (batch, q head, query tile) walking the key tiles, as
  the forward does (the same kv_bounds split into unmasked tiles and a masked band).
dQ comes one of two ways (the plan picks; configs.TRITON_ATTENTION_BACKWARD's "dq" field):
* "pass": attention_bwd_dq_kernel, its own launch. It recomputes q·kᵀ and dO·Vᵀ (7 matmuls in
  all instead of 5), but every gradient is written by exactly one program in a fixed order:
  bitwise-repeatable. deterministic=True always takes it.
* "atomic" (FlashAttention-2's way): the dK/dV kernel also computes each key tile's share dS·K
  and adds it into a zeroed float32 (B, Hq, Nq, D) accumulator with atomic adds; then
  attention_bwd_dq_store_kernel scales and casts it into dQ. 5 matmuls, but the order of the
  float32 additions varies from run to run (gradients differ in the last bits).

Causal masks are handled like the forward's: tiles every row of which sees every key skip the mask;
tiles no row sees are never visited (the dK/dV kernel may instead mask every step of one loop, by
its config row: attention_bwd_dkdv_kernel's comment says when and why). Rows past Nq load lse =
−inf, which online.probs turns into p = 0, so ragged tiles need no other mask in the dK/dV kernel
(keys past Nk are computed but never stored there; the dQ kernel masks them). 16-bit inputs: P
and dS are rounded to the input dtype for the tensor-core products, as in FlashAttention; float32
inputs use input_precision="ieee".
UPCAST (the interpreter's bfloat16, see attention_fwd.kv_loop) widens the operands to float32 and
rounds P and dS on their bits instead.
"""
import triton
import triton.language as tl

from . import online
from .attention_fwd import bf16_grid, kv_bounds, to_output


@triton.jit
def _to_dot(x, dtype: tl.constexpr, UPCAST: tl.constexpr):
    """A float32 tile as the operand of a tensor-core product in the input dtype."""
    if UPCAST:
        y = bf16_grid(x)
    else:
        y = x.to(dtype)
    return y


@triton.jit
def _dot_acc(acc, a, b, PRECISION: tl.constexpr):
    """acc + a·b. The float32 (ieee) product runs on the FMA units as one chain per element: fed
    the accumulator, the chain would run through every tile the loop visits (771 terms for dV
    over 257 query rows × a group of 3), an O(length·eps) error that measured 2.3x torch's on the
    H100 (D = 256, gpu_sanitize, 2026-11-24). So float32 sums each tile's product on its own and
    adds it: chains of one tile, then one addition per tile. The tensor-core paths accumulate in
    place (their error is the 16-bit rounding of the operands)."""
    if PRECISION == "ieee":
        acc += tl.dot(a, b, input_precision=PRECISION)
    else:
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc


@triton.jit
def _row_tile(t, n_tiles, n_heads, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, WIDE: tl.constexpr):
    """Tile t of the row-wise passes (delta, the dQ store, the dK / dV sums): BLOCK rows of one (batch,
    head) pair bh = t // n_tiles; (bh, b, h, first row, row offsets, column offsets), int64 offsets
    where WIDE."""
    bh = t // n_tiles
    r0 = (t % n_tiles) * BLOCK
    b = (bh // n_heads).to(tl.int64)
    h = (bh % n_heads).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    d = tl.arange(0, BLOCK_D)
    if WIDE:
        offs = offs.to(tl.int64)
        d = d.to(tl.int64)
    return bh, b, h, r0, offs, d


@triton.jit
def attention_bwd_delta_kernel(
        Out, DO, DLse, Delta, DQacc,
        stride_ob, stride_oh, stride_om, stride_od,
        stride_dob, stride_doh, stride_dom, stride_dod,
        n_heads, n_q, m_tiles,
        BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
        HAS_DLSE: tl.constexpr, WIDE: tl.constexpr, ZERO_ACC: tl.constexpr = False):
    """delta of BLOCK_M rows of one head; ZERO_ACC: also zero those rows of the float32 (B·Hq, Nq, D)
    dQ accumulator the atomic adds go into (one launch fewer than a separate fill: the host cost of
    a training call is mostly launches and allocations)."""
    bh, b, h, m0, offs_m, d = _row_tile(tl.program_id(0), m_tiles, n_heads, BLOCK_M, BLOCK_D, WIDE)
    rows = m0 + tl.arange(0, BLOCK_M)
    mask = (rows < n_q)[:, None] & (d < HEAD_DIM)[None, :]
    m64 = tl.cast(m0, tl.int64)
    o = tl.load(Out + b * stride_ob + h * stride_oh + m64 * stride_om
                + offs_m[:, None] * stride_om + d[None, :] * stride_od, mask=mask, other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + m64 * stride_dom
                 + offs_m[:, None] * stride_dom + d[None, :] * stride_dod, mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    row_base = bh.to(tl.int64) * n_q + m0
    if HAS_DLSE:
        delta -= tl.load(DLse + row_base + tl.arange(0, BLOCK_M), mask=rows < n_q, other=0.0)
    tl.store(Delta + row_base + tl.arange(0, BLOCK_M), delta, mask=rows < n_q)
    if ZERO_ACC:
        tl.store(DQacc + row_base * HEAD_DIM + offs_m[:, None] * HEAD_DIM + d[None, :],
                 tl.zeros([BLOCK_M, BLOCK_D], tl.float32), mask=mask)


@triton.jit
def _dkdv_loop(dk, dv, k, v, q_src, do_src, lse_src, delta_src, dq_src, stride_qm, stride_dom, q_tile,
               do_tile, dq_tile, d_ok, cols, lo, hi, n_q, n_k, causal_offset, qk_scale, head_dim,
               MASKED: tl.constexpr, BLOCK_M: tl.constexpr, EVEN_D: tl.constexpr,
               PRECISION: tl.constexpr, UPCAST: tl.constexpr, ATOMIC_DQ: tl.constexpr):
    """Fold query rows [lo, hi) of one head into (dk, dv) of the program's key tile. MASKED: apply
    the causal mask (key j visible to query i iff j <= i + causal_offset). ATOMIC_DQ: also add
    this key tile's share of dQ, dS·K, into the float32 accumulator at dq_src (unscaled)."""
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
        # lse in log2 units of the scaled scores; rows past Nq read -inf: p = 0 for them.
        lse = tl.load(lse_src + start + offs_m, mask=row_ok, other=float("-inf")) * online.LOG2E
        delta = tl.load(delta_src + start + offs_m, mask=row_ok, other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
            do = do.to(tl.float32)
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # [BLOCK_N, BLOCK_M]
        p_t = online.probs(s_t, lse[None, :], qk_scale)
        if MASKED:
            p_t = tl.where(cols[:, None] <= rows[None, :] + causal_offset, p_t, 0.0)
        dv = _dot_acc(dv, _to_dot(p_t, do.dtype, UPCAST), do, PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        ds_dot = _to_dot(ds_t, q.dtype, UPCAST)
        dk = _dot_acc(dk, ds_dot, q, PRECISION)
        if ATOMIC_DQ:
            # Keys past Nk (loaded as 0) score 0, whose p = exp(-lse) overflows to inf for a row
            # of very negative scores, and inf·0 would be NaN in dS·K: zero their dS first.
            ds_dot = tl.where((cols < n_k)[:, None], ds_dot, 0.0).to(ds_dot.dtype)
            dq = tl.dot(tl.trans(ds_dot), k, input_precision=PRECISION)
            tl.atomic_add(dq_src + m64 * head_dim + dq_tile, dq, mask=ld_mask, sem="relaxed")
    return dk, dv


@triton.jit(do_not_specialize=["n_q", "n_k", "causal_offset", "n_tiles"])
def attention_bwd_dkdv_kernel(
        Q, K, V, DO, Lse, Delta, DK, DV, DQacc,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_dob, stride_doh, stride_dom, stride_dod,
        stride_dkb, stride_dkh, stride_dkn, stride_dkd,
        stride_dvb, stride_dvh, stride_dvn, stride_dvd,
        n_kv_heads, group, n_q, n_k, causal_offset, qk_scale, sm_scale, n_tiles,
        CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
        WIDE: tl.constexpr, ATOMIC_DQ: tl.constexpr, BAND: tl.constexpr = True):
    # Consecutive programs share a kv head, so its group's q/dO stay in L2 across them.
    pid = tl.program_id(0)
    bh = pid // n_tiles
    n0 = (pid % n_tiles) * BLOCK_N
    b = (bh // n_kv_heads).to(tl.int64)
    kvh32 = bh % n_kv_heads
    kvh = kvh32.to(tl.int64)

    cols = n0 + tl.arange(0, BLOCK_N)
    col_ok = cols < n_k
    offs_n = tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    if WIDE:
        offs_n = offs_n.to(tl.int64)
        offs_m = offs_m.to(tl.int64)
        d = d.to(tl.int64)
    d_ok = d < HEAD_DIM
    kv_mask = col_ok[:, None] & d_ok[None, :]
    n64 = tl.cast(n0, tl.int64)
    k = tl.load(K + b * stride_kb + kvh * stride_kh + n64 * stride_kn
                + offs_n[:, None] * stride_kn + d[None, :] * stride_kd, mask=kv_mask, other=0.0)
    v = tl.load(V + b * stride_vb + kvh * stride_vh + n64 * stride_vn
                + offs_n[:, None] * stride_vn + d[None, :] * stride_vd, mask=kv_mask, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    # Query rows that see some key of the tile: i >= n0 - offset; every key: i >= last - offset.
    # Causal with BAND (the config row's "band"): the diagonal band [lo, full) has its own masked
    # loop and the rows past it an unmasked one, as in the forward. Without: one loop that masks
    # every step. The band's second pipelined copy of the loop body costs registers (ptxas, sm_90a:
    # 240 vs 166 at D = 64, 16x64 tiles) and the every-step mask costs time (H200, N = 4096: 19%
    # at D = 64, 16x64); only the one loop builds 32x128 tiles at D = 128 without spilling, which
    # run that causal backward 6-11% faster than 16x128 with the band (configs.py).
    if CAUSAL:
        lo = tl.maximum(n0 - causal_offset, 0)
        lo = tl.minimum((lo // BLOCK_M) * BLOCK_M, n_q)
        if BAND:
            last = tl.minimum(n0 + BLOCK_N, n_k) - 1
            full = lo + ((tl.maximum(last - causal_offset - lo, 0) + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
            full = tl.minimum(full, n_q)
        else:
            full = n_q
    else:
        lo = 0
        full = 0
    q_tile = offs_m[:, None] * stride_qm + d[None, :] * stride_qd
    do_tile = offs_m[:, None] * stride_dom + d[None, :] * stride_dod
    # The dQ accumulator: contiguous float32 (B, Hq, Nq, HEAD_DIM).
    dq_tile = offs_m[:, None] * HEAD_DIM + d[None, :]
    n_heads = n_kv_heads * group
    for g in range(0, group):
        h = kvh * group + g
        q_src = Q + b * stride_qb + h * stride_qh
        do_src = DO + b * stride_dob + h * stride_doh
        row0 = (b * n_heads + h) * n_q
        dq_src = DQacc + row0 * HEAD_DIM
        dk, dv = _dkdv_loop(dk, dv, k, v, q_src, do_src, Lse + row0, Delta + row0, dq_src, stride_qm,
                            stride_dom, q_tile, do_tile, dq_tile, d_ok, cols, lo, full, n_q, n_k,
                            causal_offset, qk_scale, HEAD_DIM, True, BLOCK_M, EVEN_D, PRECISION,
                            UPCAST, ATOMIC_DQ)
        if not CAUSAL or BAND:
            dk, dv = _dkdv_loop(dk, dv, k, v, q_src, do_src, Lse + row0, Delta + row0, dq_src, stride_qm,
                                stride_dom, q_tile, do_tile, dq_tile, d_ok, cols, full, n_q, n_q, n_k,
                                causal_offset, qk_scale, HEAD_DIM, False, BLOCK_M, EVEN_D, PRECISION,
                                UPCAST, ATOMIC_DQ)

    dk = dk * sm_scale
    tl.store(DK + b * stride_dkb + kvh * stride_dkh + n64 * stride_dkn
             + offs_n[:, None] * stride_dkn + d[None, :] * stride_dkd,
             to_output(dk, DK.dtype.element_ty, UPCAST), mask=kv_mask)
    tl.store(DV + b * stride_dvb + kvh * stride_dvh + n64 * stride_dvn
             + offs_n[:, None] * stride_dvn + d[None, :] * stride_dvd,
             to_output(dv, DV.dtype.element_ty, UPCAST), mask=kv_mask)


@triton.jit
def _dq_loop(dq, q, do, lse, delta, k_src, v_src, k_tile, v_tile, stride_kn, stride_vn, d_ok, rows,
             lo, hi, n_k, causal_offset, qk_scale,
             MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr,
             EVEN_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Fold keys [lo, hi) into dq of the program's query tile. MASKED: keys past n_k and (CAUSAL)
    keys j > i + causal_offset get p = 0."""
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
        p = online.probs(s, lse[:, None], qk_scale)
        if MASKED:
            visible = key_ok[None, :]
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + causal_offset)
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq = _dot_acc(dq, _to_dot(ds, k.dtype, UPCAST), k, PRECISION)
    return dq


@triton.jit(do_not_specialize=["n_q", "n_k", "causal_offset", "m_tiles"])
def attention_bwd_dq_kernel(
        Q, K, V, DO, Lse, Delta, DQ,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_dob, stride_doh, stride_dom, stride_dod,
        stride_dqb, stride_dqh, stride_dqm, stride_dqd,
        n_heads, group, n_q, n_k, causal_offset, qk_scale, sm_scale, m_tiles,
        CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
        WIDE: tl.constexpr):
    # As the forward: a 1-D grid, consecutive programs share a head, causal's longest rows first.
    pid = tl.program_id(0)
    bh = pid // m_tiles
    tile = pid % m_tiles
    if CAUSAL:
        tile = m_tiles - 1 - tile
    b = (bh // n_heads).to(tl.int64)
    h32 = bh % n_heads
    h = h32.to(tl.int64)
    kvh = (h32 // group).to(tl.int64)
    m0 = tile * BLOCK_M

    rows = m0 + tl.arange(0, BLOCK_M)
    row_ok = rows < n_q
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    if WIDE:
        offs_m = offs_m.to(tl.int64)
        offs_n = offs_n.to(tl.int64)
        d = d.to(tl.int64)
    d_ok = d < HEAD_DIM
    mask = row_ok[:, None] & d_ok[None, :]
    m64 = tl.cast(m0, tl.int64)
    q = tl.load(Q + b * stride_qb + h * stride_qh + m64 * stride_qm
                + offs_m[:, None] * stride_qm + d[None, :] * stride_qd, mask=mask, other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + m64 * stride_dom
                 + offs_m[:, None] * stride_dom + d[None, :] * stride_dod, mask=mask, other=0.0)
    row_base = bh.to(tl.int64) * n_q + m0
    lse = tl.load(Lse + row_base + tl.arange(0, BLOCK_M), mask=row_ok, other=float("-inf")) * online.LOG2E
    delta = tl.load(Delta + row_base + tl.arange(0, BLOCK_M), mask=row_ok, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)

    k_src = K + b * stride_kb + kvh * stride_kh
    v_src = V + b * stride_vb + kvh * stride_vh
    k_tile = offs_n[:, None] * stride_kn + d[None, :] * stride_kd
    v_tile = offs_n[:, None] * stride_vn + d[None, :] * stride_vd
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    row_last = tl.minimum(m0 + BLOCK_M, n_q) - 1
    full, end = kv_bounds(0, n_k, m0, row_last, causal_offset, CAUSAL, BLOCK_N)
    dq = _dq_loop(dq, q, do, lse, delta, k_src, v_src, k_tile, v_tile, stride_kn, stride_vn, d_ok,
                  rows, 0, full, n_k, causal_offset, qk_scale, False, CAUSAL, BLOCK_N, EVEN_D,
                  PRECISION, UPCAST)
    dq = _dq_loop(dq, q, do, lse, delta, k_src, v_src, k_tile, v_tile, stride_kn, stride_vn, d_ok,
                  rows, full, end, n_k, causal_offset, qk_scale, True, CAUSAL, BLOCK_N, EVEN_D,
                  PRECISION, UPCAST)
    dq = dq * sm_scale
    tl.store(DQ + b * stride_dqb + h * stride_dqh + m64 * stride_dqm
             + offs_m[:, None] * stride_dqm + d[None, :] * stride_dqd,
             to_output(dq, DQ.dtype.element_ty, UPCAST), mask=mask)


@triton.jit
def _dq_store_tile(DQacc, DQ, pid, stride_dqb, stride_dqh, stride_dqm, stride_dqd, n_heads, n_q, sm_scale,
                   m_tiles, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                   WIDE: tl.constexpr, UPCAST: tl.constexpr):
    """Tile `pid` (BLOCK_M rows of one head) of dQ = scale · the float32 accumulator."""
    bh, b, h, m0, offs_m, d = _row_tile(pid, m_tiles, n_heads, BLOCK_M, BLOCK_D, WIDE)
    rows = m0 + tl.arange(0, BLOCK_M)
    mask = (rows < n_q)[:, None] & (d < HEAD_DIM)[None, :]
    m64 = tl.cast(m0, tl.int64)
    acc = tl.load(DQacc + (bh.to(tl.int64) * n_q + m64) * HEAD_DIM + offs_m[:, None] * HEAD_DIM + d[None, :],
                  mask=mask, other=0.0)
    tl.store(DQ + b * stride_dqb + h * stride_dqh + m64 * stride_dqm + offs_m[:, None] * stride_dqm
             + d[None, :] * stride_dqd, to_output(acc * sm_scale, DQ.dtype.element_ty, UPCAST), mask=mask)


@triton.jit
def attention_bwd_dq_store_kernel(
        DQacc, DQ, stride_dqb, stride_dqh, stride_dqm, stride_dqd, n_heads, n_q, sm_scale, m_tiles,
        BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, WIDE: tl.constexpr,
        UPCAST: tl.constexpr = False):
    """dQ = scale · the float32 accumulator the atomic dK/dV kernel filled, in dQ's dtype and
    strides."""
    _dq_store_tile(DQacc, DQ, tl.program_id(0), stride_dqb, stride_dqh, stride_dqm, stride_dqd, n_heads, n_q,
                   sm_scale, m_tiles, BLOCK_M, HEAD_DIM, BLOCK_D, WIDE, UPCAST)


@triton.jit
def attention_bwd_finish_kernel(
        DQacc, DQ, Part, DK, DV,
        stride_dqb, stride_dqh, stride_dqm, stride_dqd,
        stride_dkb, stride_dkh, stride_dkn, stride_dkd,
        stride_dvb, stride_dvh, stride_dvn, stride_dvd,
        n_heads, n_q, sm_scale, m_tiles, n_kv_heads, n_k, n_tiles, dq_programs, part_half,
        SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr, WIDE: tl.constexpr, UPCAST: tl.constexpr = False):
    """The end of a backward whose GQA groups were split among CTAs (the wgmma kernel's kv_split), one
    launch: programs [0, dq_programs) store dQ as attention_bwd_dq_store_kernel does (BLOCK_M rows
    each); the rest each sum the SPLITS float32 partials of dK and dV of BLOCK_N keys of one (batch,
    kv head; BLOCK_N·BLOCK_D small: two accumulators and two loads live at once), in a fixed order
    (the same bits every run), and store them in dk's and dv's dtype and strides. Part: float32
    (2, B, Hkv·SPLITS, Nk, D) contiguous, dK's partials (already scaled) then dV's part_half
    elements on; partial j of kv head h at head h·SPLITS + j."""
    pid = tl.program_id(0)
    if pid < dq_programs:
        _dq_store_tile(DQacc, DQ, pid, stride_dqb, stride_dqh, stride_dqm, stride_dqd, n_heads, n_q,
                       sm_scale, m_tiles, BLOCK_M, HEAD_DIM, BLOCK_D, WIDE, UPCAST)
    else:
        bh, b, h, n0, offs_n, d = _row_tile(pid - dq_programs, n_tiles, n_kv_heads, BLOCK_N, BLOCK_D, WIDE)
        keys = n0 + tl.arange(0, BLOCK_N)
        mask = (keys < n_k)[:, None] & (d < HEAD_DIM)[None, :]
        n64 = tl.cast(n0, tl.int64)
        # Partial j of this tile: row (bh·SPLITS + j)·Nk + n0 of dK's half.
        src = Part + (bh.to(tl.int64) * SPLITS * n_k + n64) * HEAD_DIM + offs_n[:, None] * HEAD_DIM + d[None, :]
        head = tl.cast(n_k, tl.int64) * HEAD_DIM  # one partial's elements
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        for j in range(SPLITS):
            dk += tl.load(src + j * head, mask=mask, other=0.0)
            dv += tl.load(src + part_half + j * head, mask=mask, other=0.0)
        tl.store(DK + b * stride_dkb + h * stride_dkh + n64 * stride_dkn + offs_n[:, None] * stride_dkn
                 + d[None, :] * stride_dkd, to_output(dk, DK.dtype.element_ty, UPCAST), mask=mask)
        tl.store(DV + b * stride_dvb + h * stride_dvh + n64 * stride_dvn + offs_n[:, None] * stride_dvn
                 + d[None, :] * stride_dvd, to_output(dv, DV.dtype.element_ty, UPCAST), mask=mask)
