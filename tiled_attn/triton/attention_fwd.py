"""Fused attention forward (FlashAttention-2 in Triton): one program per (batch, head, query tile).

The query tile [BLOCK_M, BLOCK_D] stays in registers while the program walks the key/value tiles:
scores = q·kᵀ on the tensor cores, folded into the online-softmax state with `online.update`, the
accumulator rescaled by the same factor, then acc += p·v. The full N×N score matrix never exists.

Numerics: scores are pre-multiplied by sm_scale·log2(e) (one multiply per score) so every
exponential is an exp2 and the verbs run with scale = 1.0 (online.py's docstring). The 16-bit
paths round p to the input dtype for the second matmul, as FlashAttention does; float32 inputs use
input_precision="ieee", since TF32's 10-bit mantissa would be far outside the numerics rule
(DESIGN §4) against torch's float32.

Masking costs nothing off the diagonal: `kv_bounds` splits each key range into tiles every query of
the tile sees in full (`kv_loop` with MASKED=False: no mask, no bounds checks on keys) and a band
that needs the causal mask and/or the ragged end of the keys (MASKED=True). Tiles no query of the
tile can see are never visited. The same two helpers serve the split-KV decode kernel
(attention_decode.py), whose query rows come from several heads.
"""
import triton
import triton.language as tl

from . import online


@triton.jit
def kv_bounds(lo, hi, row_first, row_last, causal_offset, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """Split keys [lo, hi) for query rows row_first..row_last (query i sees key j iff
    j <= i + causal_offset): every row sees all of [lo, full) (whole BLOCK_N tiles); [full, end) is
    the band that needs masking; keys past `end` are invisible to every row of the tile."""
    if CAUSAL:
        end = tl.maximum(tl.minimum(hi, row_last + causal_offset + 1), lo)
        full = tl.maximum(tl.minimum(end, row_first + causal_offset + 1), lo)
    else:
        end = hi
        full = hi
    full = lo + ((full - lo) // BLOCK_N) * BLOCK_N
    return full, end


@triton.jit
def load_q(ptrs, row_ok, d_ok, EVEN_D: tl.constexpr):
    """The query tile [rows, BLOCK_D], zero in padded rows and padded head-dim columns."""
    if EVEN_D:
        q = tl.load(ptrs, mask=row_ok[:, None], other=0.0)
    else:
        q = tl.load(ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    return q


@triton.jit
def bf16_grid(x):
    """Round float32 x to the nearest-even bfloat16 value, kept in float32 (interpreter only)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def to_output(x, dtype: tl.constexpr, UPCAST: tl.constexpr):
    """x.to(dtype), rounded to nearest even (on the GPU that is the conversion's own rounding)."""
    if UPCAST:
        x = bf16_grid(x)
    return x.to(dtype)


@triton.jit
def kv_loop(acc, m, l, q, k_base, v_base, k_tile, v_tile, stride_kn, stride_vn, rows, d_ok,
            lo, hi, n_k, causal_offset, qk_scale,
            MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr,
            EVEN_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Fold keys [lo, hi) (lo a multiple of BLOCK_N) into (acc, m, l) for the query tile q.

    The last tile of a MASKED range is cut by n_k and the causal mask, not by hi: so hi must be n_k
    or a multiple of BLOCK_N (the split-KV ranges are), or keys past hi would be folded in too.

    k_base/v_base point at key 0 of this program's kv head (64-bit offsets already applied);
    k_tile/v_tile are the in-tile offsets [BLOCK_N, BLOCK_D]; `rows` are the query indices of the
    tile's rows, used by the causal mask. With MASKED, keys j >= n_k and (CAUSAL) j > i + offset
    score -inf, which the verbs turn into p = 0 (and a fully masked row keeps m = -inf, l = 0).

    UPCAST is set only under TRITON_INTERPRET=1 for bfloat16, where Triton 3.6's interpreter has two
    bugs: it multiplies bfloat16 as raw uint16 bit patterns, and its float32 -> bfloat16 cast
    truncates instead of rounding to nearest. There the operands are widened to float32 (exact) and
    multiplied with PRECISION = "ieee", accumulating in float32 as the tensor cores do, and p is
    rounded to the bfloat16 grid on its bits (bf16_grid), so the CPU tests see the GPU's numerics.
    """
    # Pointer steps in 64 bits: BLOCK_N·stride can pass 2^31 for a huge key stride.
    k_ptrs = k_base + tl.cast(lo, tl.int64) * stride_kn + k_tile
    v_ptrs = v_base + tl.cast(lo, tl.int64) * stride_vn + v_tile
    k_step = tl.full([], BLOCK_N, tl.int64) * stride_kn
    v_step = tl.full([], BLOCK_N, tl.int64) * stride_vn
    offs_n = tl.arange(0, BLOCK_N)
    if UPCAST:
        q = q.to(tl.float32)
    # Loads are written out here rather than through a helper: each nested jit call costs ~2 ms
    # in the interpreter, per key tile. The masks exist only where a constexpr says the tile can
    # be ragged, so the unmasked loop issues plain (vectorized, pipelined) loads.
    for start in range(lo, hi, BLOCK_N):
        cols = start + offs_n
        key_ok = cols < n_k
        if MASKED:
            if EVEN_D:
                kv_mask = key_ok[:, None]
            else:
                kv_mask = key_ok[:, None] & d_ok[None, :]
            kv_other = 0.0
        else:
            if EVEN_D:
                kv_mask = None
                kv_other = None
            else:
                kv_mask = d_ok[None, :]
                kv_other = 0.0
        k = tl.load(k_ptrs, mask=kv_mask, other=kv_other)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        if MASKED:
            visible = key_ok[None, :]
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + causal_offset)
            s = tl.where(visible, s, float("-inf"))
        m, l, p, alpha = online.update(m, l, s, 1.0)
        v = tl.load(v_ptrs, mask=kv_mask, other=kv_other)
        # 16-bit inputs: p is rounded to the input dtype for the tensor-core P·V, as in FlashAttention.
        if UPCAST:  # inline, not to_output(): a nested call per key tile is slow in the interpreter
            bits = p.to(tl.uint32, bitcast=True)
            p = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
            v = v.to(tl.float32)
        else:
            p = p.to(v_base.dtype.element_ty)
        acc = tl.dot(p, v, acc * alpha[:, None], input_precision=PRECISION)
        k_ptrs += k_step
        v_ptrs += v_step
    return acc, m, l


@triton.jit
def tile_offsets(stride_n, stride_d, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, WIDE: tl.constexpr):
    """In-tile element offsets [BLOCK, BLOCK_D]; int64 when a stride times a block could pass 2^31."""
    offs_n = tl.arange(0, BLOCK)
    offs_d = tl.arange(0, BLOCK_D)
    if WIDE:
        offs_n = offs_n.to(tl.int64)
        offs_d = offs_d.to(tl.int64)
    return offs_n[:, None] * stride_n + offs_d[None, :] * stride_d


@triton.jit(do_not_specialize=["n_q", "n_k", "causal_offset", "m_tiles"])
def attention_fwd_kernel(
        Q, K, V, Out, Lse,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_om, stride_od,
        n_heads, group, n_q, n_k, causal_offset, qk_scale, m_tiles,
        CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
        WIDE: tl.constexpr):
    # A 1-D grid (the y/z grid dims cap at 65535, B·H can exceed it); consecutive programs share a
    # head, so its K/V stay in L2. Causal: the longest rows (last query tiles) start first, so the
    # short tiles fill the tail of the schedule.
    pid = tl.program_id(0)
    bh = pid // m_tiles
    tile = pid % m_tiles
    if CAUSAL:
        tile = m_tiles - 1 - tile
    b = (bh // n_heads).to(tl.int64)
    h = bh % n_heads
    kvh = (h // group).to(tl.int64)
    h = h.to(tl.int64)
    m0 = tile * BLOCK_M

    rows = m0 + tl.arange(0, BLOCK_M)
    row_ok = rows < n_q
    d_ok = tl.arange(0, BLOCK_D) < HEAD_DIM
    q_base = Q + b * stride_qb + h * stride_qh + tl.cast(m0, tl.int64) * stride_qm
    q = load_q(q_base + tile_offsets(stride_qm, stride_qd, BLOCK_M, BLOCK_D, WIDE), row_ok, d_ok, EVEN_D)

    k_base = K + b * stride_kb + kvh * stride_kh
    v_base = V + b * stride_vb + kvh * stride_vh
    k_tile = tile_offsets(stride_kn, stride_kd, BLOCK_N, BLOCK_D, WIDE)
    v_tile = tile_offsets(stride_vn, stride_vd, BLOCK_N, BLOCK_D, WIDE)

    m, l = online.identity(BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    row_last = tl.minimum(m0 + BLOCK_M, n_q) - 1
    full, end = kv_bounds(0, n_k, m0, row_last, causal_offset, CAUSAL, BLOCK_N)
    acc, m, l = kv_loop(acc, m, l, q, k_base, v_base, k_tile, v_tile, stride_kn, stride_vn, rows, d_ok,
                        0, full, n_k, causal_offset, qk_scale,
                        False, CAUSAL, BLOCK_N, EVEN_D, PRECISION, UPCAST)
    acc, m, l = kv_loop(acc, m, l, q, k_base, v_base, k_tile, v_tile, stride_kn, stride_vn, rows, d_ok,
                        full, end, n_k, causal_offset, qk_scale,
                        True, CAUSAL, BLOCK_N, EVEN_D, PRECISION, UPCAST)

    out = online.attention_out(acc, l)
    o_base = Out + b * stride_ob + h * stride_oh + tl.cast(m0, tl.int64) * stride_om
    o_ptrs = o_base + tile_offsets(stride_om, stride_od, BLOCK_M, BLOCK_D, WIDE)
    out = to_output(out, Out.dtype.element_ty, UPCAST)
    if EVEN_D:
        tl.store(o_ptrs, out, mask=row_ok[:, None])
    else:
        tl.store(o_ptrs, out, mask=row_ok[:, None] & d_ok[None, :])
    lse_ptrs = Lse + (bh.to(tl.int64) * n_q + m0) + tl.arange(0, BLOCK_M)
    tl.store(lse_ptrs, online.lse(m, l, 1.0), mask=row_ok)
