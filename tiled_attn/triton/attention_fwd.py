"""Fused attention forward (FlashAttention-2 in Triton): one program per (batch, head, query tile).

The query tile [BLOCK_M, BLOCK_D] stays in registers while the program walks the key/value tiles:
scores = q·kᵀ on the tensor cores, folded into the online-softmax state with the online verbs, the
accumulator rescaled by the same factor, then acc += p·v. The full N×N score matrix never exists.

Numerics. Two score conventions (RAW, chosen by the wrapper; both call the same verbs):
* RAW = False: scores are pre-multiplied by sm_scale·log2(e) (one multiply per score) so the
  verbs run with scale = 1.0 and m is in log2 units (online.py's docstring).
* RAW = True: scores stay q·k and the verbs get sm_scale·log2(e) as their scale, so
  exp2((s − m)·c), or with FMA = True exp2(s·c − m·c) as one fused multiply-add per score (the form
  of the Triton tutorial and FlexAttention: one instruction fewer per score than the multiply then
  subtract). Needs sm_scale > 0; the wrapper falls back to RAW = False otherwise.
The 16-bit paths round p to the input dtype for the second matmul, as FlashAttention does. float32
inputs use input_precision="ieee" (TF32's 10-bit mantissa is far outside the numerics rule,
DESIGN §4) and ACCURATE finalization (online.py), and split the q·k reduction into SPLIT_D chunks of
16 head dims summed at the end: on the GPU an ieee dot is one chain of D fused multiply-adds per
score, whose rounding error grows like D (measured in emulation: D = 111, Nq = 1 against 239 keys,
max output error 4.5e-7 as one chain, 1.9e-7 in chunks, torch's own 0.8-2e-7), so chunks keep the
float32 kernels within 2× of torch's blocked BLAS/cuBLAS sums.

Masking costs nothing off the diagonal: `kv_bounds` splits each key range into tiles every query of
the tile sees in full (`kv_loop` with MASKED=False: no mask, no bounds checks on keys) and a band
that needs the causal mask and/or the ragged end of the keys (MASKED=True). Tiles no query of the
tile can see are never visited. The same helpers serve the split-KV decode kernel
(attention_decode.py), whose query rows come from several heads.

Addressing of the K/V tiles (ADDR, a config field so the tuning sweep can compare them):
"ptr" carries [BLOCK_N, BLOCK_D] pointer tensors across iterations (advanced by a 64-bit step);
"offs" rebuilds them each iteration from a scalar 64-bit base and loop-invariant in-tile offsets,
so the loop carries no pointer tensor (fewer live registers); "tma" loads through Hopper tensor
descriptors (K and V are then host TensorDescriptors over (B, Hkv, Nk, D), whose zero fill past
Nk and D replaces every load mask; the wrapper uses it only where TMA's alignment rules hold).
LATE_L folds Σp into l after the P·V product is issued, so the row sum can overlap the MMA.
"""
import triton
import triton.language as tl

from . import masks, online


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
def head_dims(BLOCK_D: tl.constexpr, SPLIT_D: tl.constexpr, WIDE: tl.constexpr):
    """Head-dim indices: [BLOCK_D], or [SPLIT_D, BLOCK_D // SPLIT_D] (chunk, index in chunk) for
    the chunked float32 q·k; int64 when a stride times them could pass 2^31."""
    if SPLIT_D > 1:
        DC: tl.constexpr = BLOCK_D // SPLIT_D
        d = tl.arange(0, SPLIT_D)[:, None] * DC + tl.arange(0, DC)[None, :]
    else:
        d = tl.arange(0, BLOCK_D)
    if WIDE:
        d = d.to(tl.int64)
    return d


@triton.jit
def q_offsets(row_offs, d, stride_d, SPLIT_D: tl.constexpr):
    """Element offsets of the query tile from per-row offsets [BLOCK_M]: [BLOCK_M, BLOCK_D], or
    [SPLIT_D, BLOCK_M, DC] for the chunked dot (batch = chunk)."""
    if SPLIT_D > 1:
        offs = row_offs[None, :, None] + d[:, None, :] * stride_d
    else:
        offs = row_offs[:, None] + d[None, :] * stride_d
    return offs


@triton.jit
def q_mask(row_ok, d_ok, EVEN_D: tl.constexpr, SPLIT_D: tl.constexpr):
    if SPLIT_D > 1:
        mask = row_ok[None, :, None]
        if not EVEN_D:
            mask = mask & d_ok[:, None, :]
    else:
        mask = row_ok[:, None]
        if not EVEN_D:
            mask = mask & d_ok[None, :]
    return mask


@triton.jit
def k_offsets(stride_n, d, stride_d, BLOCK_N: tl.constexpr, SPLIT_D: tl.constexpr, WIDE: tl.constexpr):
    """In-tile offsets of a key tile: [BLOCK_N, BLOCK_D], or [SPLIT_D, DC, BLOCK_N] (already
    transposed for the chunked dot)."""
    n = tl.arange(0, BLOCK_N)
    if WIDE:
        n = n.to(tl.int64)
    if SPLIT_D > 1:
        offs = n[None, None, :] * stride_n + d[:, :, None] * stride_d
    else:
        offs = n[:, None] * stride_n + d[None, :] * stride_d
    return offs


@triton.jit
def dk_mask(d_ok, SPLIT_D: tl.constexpr):
    """The head-dim mask shaped to broadcast against a key tile (see k_offsets)."""
    if SPLIT_D > 1:
        mask = d_ok[:, :, None]
    else:
        mask = d_ok[None, :]
    return mask


@triton.jit
def page_vector(bt_src, lo, n_entries, page_size, PAGE_VEC: tl.constexpr):
    """Block-table entries lo // page_size .. + PAGE_VEC - 1 (past the table: 0) and the first's
    index, for kv_loop's PAGE_VEC: one load a program instead of a dependent load a key tile."""
    e0 = lo // page_size
    offs = e0 + tl.arange(0, PAGE_VEC)
    return tl.load(bt_src + offs, mask=offs < n_entries, other=0), e0


@triton.jit
def kv_loop(acc, m, l, q, k_src, v_src, k_tile, v_tile, stride_kn, stride_vn, kv_b, kv_h, kv_row0,
            rows, dk_ok, dv_ok, lo, hi, n_k, offset, left, right, qk_scale,
            slopes, cap_in, cap_out, km_src, stride_mn, bt_src, page_size, n_pages, stride_kp, stride_vp,
            pages, page_e0, acc2, q2, k_src2, v_src2, k_tile2, v_tile2,
            MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
            RAW: tl.constexpr, FMA: tl.constexpr, LATE_L: tl.constexpr, SPLIT_D: tl.constexpr,
            ADDR: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, KEY_MASK: tl.constexpr,
            PAGED: tl.constexpr, PAGE_VEC: tl.constexpr, BLOCK_D2: tl.constexpr):
    """Fold keys [lo, hi) (lo a multiple of BLOCK_N) into (acc, m, l, acc2) for the query tile q.

    The last tile of a MASKED range is cut by n_k and the window, not by hi: so hi must be n_k,
    a multiple of BLOCK_N or the window's own edge (masks.kv_ranges' ranges are), or keys past hi
    would be folded in too.

    k_src/v_src: with ADDR "ptr"/"offs" pointers at key 0 of this program's kv head (64-bit
    offsets already applied) and k_tile/v_tile the in-tile offsets (k_offsets); with "tma" the
    tensor descriptors, read at (kv_b, kv_h, kv_row0 + key, 0) (kv_row0: a packed sequence's first
    key row). `rows` are the query indices of the tile's
    rows (the window and ALiBi use them); dk_ok/dv_ok the head-dim masks shaped for the K and V
    tiles. With MASKED, keys j >= n_k and keys outside row i's window score -inf, which the verbs
    turn into p = 0 (and a fully masked row keeps m = -inf, l = 0). The score modifications of
    masks.py (SOFTCAP, ALIBI, KEY_MASK) apply to every tile; they need RAW = False (scores in log2
    units). PAGED: key j lives in page bt_src[j // page_size] (k_src/v_src then point at the kv
    head of page 0; page_size is a constexpr); ADDR is "offs". PAGE_VEC > 0 (page_size a multiple
    of BLOCK_N): the table entries page_e0 .. page_e0 + PAGE_VEC - 1 are already in registers
    (`pages`, from page_vector) and hold every page of [lo, hi), so no tile waits on a table read.

    UPCAST is set only under TRITON_INTERPRET=1 for bfloat16, where Triton 3.6's interpreter has two
    bugs: it multiplies bfloat16 as raw uint16 bit patterns, and its float32 -> bfloat16 cast
    truncates instead of rounding to nearest. There the operands are widened to float32 (exact) and
    multiplied with PRECISION = "ieee", accumulating in float32 as the tensor cores do, and p is
    rounded to the bfloat16 grid on its bits (bf16_grid), so the CPU tests see the GPU's numerics.

    BLOCK_D2 > 0: the head dim is two power-of-two parts, head dims [0, BLOCK_D) in (q, k, v, acc)
    and [BLOCK_D, BLOCK_D + BLOCK_D2) in (q2, k2, v2, acc2) (fwd_program's doc says why); with
    "tma" k_src2/v_src2 are descriptors of BLOCK_D2-wide blocks, else k_src/v_src again with
    k_tile2/v_tile2 that part's in-tile offsets from head dim 0. Neither part is ragged (EVEN_D),
    nothing is paged and SPLIT_D is 1. BLOCK_D2 = 0: acc2, q2, k_src2, v_src2, k_tile2 and v_tile2 are never read and
    acc2 comes back as it came.
    """
    if BLOCK_D2 > 0:
        tl.static_assert(EVEN_D and SPLIT_D == 1 and not PAGED)
    offs_n = tl.arange(0, BLOCK_N)
    if ADDR == "ptr":
        # Pointer steps in 64 bits: BLOCK_N·stride can pass 2^31 for a huge key stride.
        k_ptrs = k_src + tl.cast(lo, tl.int64) * stride_kn + k_tile
        v_ptrs = v_src + tl.cast(lo, tl.int64) * stride_vn + v_tile
        k_step = tl.full([], BLOCK_N, tl.int64) * stride_kn
        v_step = tl.full([], BLOCK_N, tl.int64) * stride_vn
        if BLOCK_D2 > 0:
            k_ptrs2 = k_src2 + tl.cast(lo, tl.int64) * stride_kn + k_tile2
            v_ptrs2 = v_src2 + tl.cast(lo, tl.int64) * stride_vn + v_tile2
    if PAGED:
        # The tile's pointers are formed once; each page then moves them by one 64-bit scalar
        # (two integer adds a pointer, as the dense "ptr" step) instead of re-deriving every
        # pointer from its 32-bit offset (sm_90a SASS: +15% instructions a tile).
        k_tile_ptrs = k_src + k_tile
        v_tile_ptrs = v_src + v_tile
    if UPCAST:
        q = q.to(tl.float32)
        if BLOCK_D2 > 0:
            q2 = q2.to(tl.float32)
    # Loads are written out here rather than through a helper: each nested jit call costs ~0.3-2 ms
    # in the interpreter, per key tile. The masks exist only where a constexpr says the tile can
    # be ragged, so the unmasked loop issues plain (vectorized, pipelined) loads.
    for start in range(lo, hi, BLOCK_N):
        cols = start + offs_n
        key_ok = cols < n_k
        if ADDR == "tma":
            k = k_src.load([kv_b, kv_h, kv_row0 + start, 0]).reshape(BLOCK_N, BLOCK_D)
            v = v_src.load([kv_b, kv_h, kv_row0 + start, 0]).reshape(BLOCK_N, BLOCK_D)
            if BLOCK_D2 > 0:
                k2 = k_src2.load([kv_b, kv_h, kv_row0 + start, BLOCK_D]).reshape(BLOCK_N, BLOCK_D2)
                v2 = v_src2.load([kv_b, kv_h, kv_row0 + start, BLOCK_D]).reshape(BLOCK_N, BLOCK_D2)
        else:
            if PAGED:
                # Page indices are clamped into the cache: a bad table entry (possible only where
                # the host did not check it) reads a wrong page, never out of bounds.
                if page_size % BLOCK_N == 0:
                    # The tile lies in one page: one index, and rows as contiguous as a dense cache.
                    if PAGE_VEC > 0:
                        entry = start // page_size - page_e0
                        page = tl.sum(tl.where(tl.arange(0, PAGE_VEC) == entry, pages, 0), axis=0)
                    else:
                        page = tl.load(bt_src + start // page_size)
                    page = tl.minimum(tl.maximum(page, 0), n_pages - 1).to(tl.int64)
                    in_page = tl.cast(start % page_size, tl.int64)
                    k_ptrs = k_tile_ptrs + (page * stride_kp + in_page * stride_kn)
                    v_ptrs = v_tile_ptrs + (page * stride_vp + in_page * stride_vn)
                else:
                    page = tl.load(bt_src + cols // page_size, mask=key_ok, other=0)
                    page = tl.minimum(tl.maximum(page, 0), n_pages - 1).to(tl.int64)
                    # k_tile holds offs_n·stride_kn: each row's own page and slot replace it.
                    slot = (cols % page_size - offs_n).to(tl.int64)
                    k_rows = page * stride_kp + slot * stride_kn
                    v_rows = page * stride_vp + slot * stride_vn
                    if SPLIT_D > 1:
                        k_ptrs = k_src + k_rows[None, None, :] + k_tile
                    else:
                        k_ptrs = k_src + k_rows[:, None] + k_tile
                    v_ptrs = v_src + v_rows[:, None] + v_tile
            elif ADDR == "offs":
                k_ptrs = k_src + tl.cast(start, tl.int64) * stride_kn + k_tile
                v_ptrs = v_src + tl.cast(start, tl.int64) * stride_vn + v_tile
                if BLOCK_D2 > 0:
                    k_ptrs2 = k_src2 + tl.cast(start, tl.int64) * stride_kn + k_tile2
                    v_ptrs2 = v_src2 + tl.cast(start, tl.int64) * stride_vn + v_tile2
            if MASKED:
                if SPLIT_D > 1:
                    k_mask = key_ok[None, None, :]
                else:
                    k_mask = key_ok[:, None]
                v_mask = key_ok[:, None]
                if not EVEN_D:
                    k_mask = k_mask & dk_ok
                    v_mask = v_mask & dv_ok
                k = tl.load(k_ptrs, mask=k_mask, other=0.0)
                if BLOCK_D2 > 0:
                    k2 = tl.load(k_ptrs2, mask=key_ok[:, None], other=0.0)
            elif EVEN_D:
                k = tl.load(k_ptrs)
                if BLOCK_D2 > 0:
                    k2 = tl.load(k_ptrs2)
            else:
                k = tl.load(k_ptrs, mask=dk_ok, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        if SPLIT_D > 1:
            s = tl.sum(tl.dot(q, k, input_precision=PRECISION), axis=0)
        else:
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if BLOCK_D2 > 0:
            if UPCAST:
                k2 = k2.to(tl.float32)
            s = tl.dot(q2, tl.trans(k2), s, input_precision=PRECISION)
        if SOFTCAP:
            s, _ = masks.softcap(s, cap_in, cap_out, PRECISION == "ieee")
        elif not RAW:
            s = s * qk_scale
        if ALIBI:
            s = masks.alibi(s, rows, cols, offset, slopes)
        if KEY_MASK == 1:
            keep = tl.load(km_src + cols * stride_mn, mask=key_ok, other=0)
            s = tl.where(keep[None, :] != 0, s, float("-inf"))
        elif KEY_MASK == 2:
            s += tl.load(km_src + cols * stride_mn, mask=key_ok, other=0.0).to(tl.float32)[None, :] * masks.LOG2E
        if MASKED:
            s = tl.where(masks.visible(rows, cols, key_ok, offset, left, right, HAS_LEFT, HAS_RIGHT),
                         s, float("-inf"))
        if RAW:
            m, p, alpha = online.update_max(m, s, qk_scale, FMA)
        else:
            m, p, alpha = online.update_max(m, s, 1.0)
        if not LATE_L:
            l = online.update_sum(l, p, alpha)
        if ADDR != "tma":
            if MASKED:
                v = tl.load(v_ptrs, mask=v_mask, other=0.0)
                if BLOCK_D2 > 0:
                    v2 = tl.load(v_ptrs2, mask=key_ok[:, None], other=0.0)
            elif EVEN_D:
                v = tl.load(v_ptrs)
                if BLOCK_D2 > 0:
                    v2 = tl.load(v_ptrs2)
            else:
                v = tl.load(v_ptrs, mask=dv_ok, other=0.0)
        # 16-bit inputs: p is rounded to the input dtype for the tensor-core P·V, as in FlashAttention.
        if UPCAST:  # inline, not to_output(): a nested call per key tile is slow in the interpreter
            bits = p.to(tl.uint32, bitcast=True)
            p_dot = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
            v = v.to(tl.float32)
            if BLOCK_D2 > 0:
                v2 = v2.to(tl.float32)
        else:
            p_dot = p.to(v.dtype)
        acc = tl.dot(p_dot, v, acc * alpha[:, None], input_precision=PRECISION)
        if BLOCK_D2 > 0:
            acc2 = tl.dot(p_dot, v2, acc2 * alpha[:, None], input_precision=PRECISION)
        if LATE_L:
            l = online.update_sum(l, p, alpha)
        if ADDR == "ptr":
            k_ptrs += k_step
            v_ptrs += v_step
            if BLOCK_D2 > 0:
                k_ptrs2 += k_step
                v_ptrs2 += v_step
    return acc, m, l, acc2


@triton.jit
def kv_walk(acc, m, l, q, k_src, v_src, k_tile, v_tile, stride_kn, stride_vn, kv_b, kv_h, kv_row0,
            rows, dk_ok, dv_ok, lo, hi, row_first, row_last, n_k, offset, left, right, qk_scale,
            slopes, cap_in, cap_out, km_src, stride_mn, bt_src, page_size, n_pages, stride_kp, stride_vp,
            pages, page_e0, acc2, q2, k_src2, v_src2, k_tile2, v_tile2,
            HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
            RAW: tl.constexpr, FMA: tl.constexpr, LATE_L: tl.constexpr, SPLIT_D: tl.constexpr,
            ADDR: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, KEY_MASK: tl.constexpr,
            PAGED: tl.constexpr, PAGE_VEC: tl.constexpr, BLOCK_D2: tl.constexpr):
    """Fold every key of [lo, hi) that rows row_first..row_last can see: the three ranges of
    masks.kv_ranges (the masked head only where a window has a left edge). The second head-dim
    part (acc2 .. BLOCK_D2) is kv_loop's."""
    start, full_lo, full_hi, end = masks.kv_ranges(lo, hi, row_first, row_last, offset, left, right,
                                                   HAS_LEFT, HAS_RIGHT, BLOCK_N)
    if HAS_LEFT:
        acc, m, l, acc2 = kv_loop(acc, m, l, q, k_src, v_src, k_tile, v_tile, stride_kn, stride_vn, kv_b, kv_h,
                                  kv_row0, rows, dk_ok, dv_ok, start, full_lo, n_k, offset, left, right, qk_scale,
                                  slopes, cap_in, cap_out, km_src, stride_mn, bt_src, page_size, n_pages,
                                  stride_kp, stride_vp, pages, page_e0, acc2, q2, k_src2, v_src2, k_tile2, v_tile2,
                                  True, HAS_LEFT, HAS_RIGHT, BLOCK_N, BLOCK_D, EVEN_D, PRECISION, UPCAST, RAW,
                                  FMA, LATE_L, SPLIT_D, ADDR, SOFTCAP, ALIBI, KEY_MASK, PAGED, PAGE_VEC, BLOCK_D2)
    acc, m, l, acc2 = kv_loop(acc, m, l, q, k_src, v_src, k_tile, v_tile, stride_kn, stride_vn, kv_b, kv_h,
                              kv_row0, rows, dk_ok, dv_ok, full_lo, full_hi, n_k, offset, left, right, qk_scale,
                              slopes, cap_in, cap_out, km_src, stride_mn, bt_src, page_size, n_pages,
                              stride_kp, stride_vp, pages, page_e0, acc2, q2, k_src2, v_src2, k_tile2, v_tile2,
                              False, HAS_LEFT, HAS_RIGHT, BLOCK_N, BLOCK_D, EVEN_D, PRECISION, UPCAST, RAW,
                              FMA, LATE_L, SPLIT_D, ADDR, SOFTCAP, ALIBI, KEY_MASK, PAGED, PAGE_VEC, BLOCK_D2)
    acc, m, l, acc2 = kv_loop(acc, m, l, q, k_src, v_src, k_tile, v_tile, stride_kn, stride_vn, kv_b, kv_h,
                              kv_row0, rows, dk_ok, dv_ok, full_hi, end, n_k, offset, left, right, qk_scale,
                              slopes, cap_in, cap_out, km_src, stride_mn, bt_src, page_size, n_pages,
                              stride_kp, stride_vp, pages, page_e0, acc2, q2, k_src2, v_src2, k_tile2, v_tile2,
                              True, HAS_LEFT, HAS_RIGHT, BLOCK_N, BLOCK_D, EVEN_D, PRECISION, UPCAST, RAW,
                              FMA, LATE_L, SPLIT_D, ADDR, SOFTCAP, ALIBI, KEY_MASK, PAGED, PAGE_VEC, BLOCK_D2)
    return acc, m, l, acc2


@triton.jit
def finish_scale(qk_scale, RAW: tl.constexpr):
    """The scale the state (m) was built with: lse() and merge() take it."""
    if RAW:
        scale = qk_scale
    else:
        scale = 1.0
    return scale


@triton.jit
def fwd_program(
        Q, K, V, Out, Lse, Slopes, KeyMask, CuQ, CuK, SeqK, BlockTable, K2, V2,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_om, stride_od,
        stride_sb, stride_mb, stride_mn, stride_tb, n_pages,
        n_heads, group, n_q, n_k, offset, left, right, qk_scale, cap_in, cap_out, m_tiles,
        HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr,
        UPCAST: tl.constexpr, WIDE: tl.constexpr, RAW: tl.constexpr, FMA: tl.constexpr,
        LATE_L: tl.constexpr, SPLIT_D: tl.constexpr, ACCURATE: tl.constexpr, ADDR: tl.constexpr,
        SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, KEY_MASK: tl.constexpr, VARLEN: tl.constexpr,
        SEQ_K: tl.constexpr, PAGED: tl.constexpr, PAGE: tl.constexpr, STORE_LSE: tl.constexpr,
        BLOCK_D2: tl.constexpr):
    """One (batch, head, query tile) of the forward. Dense calls (attention_fwd_kernel) switch
    every extension off; attention_fwd_ext_kernel turns them on by constexpr:
    * VARLEN: batch b is sequence b of a packed layout: its queries are rows CuQ[b]..CuQ[b+1] and
      its keys rows CuK[b]..CuK[b+1] of the (1, H, total, D) views (batch strides 0); n_q/n_k are
      the totals (every index is clamped into them) and lse is (Hq, total_q).
    * SEQ_K: batch b has SeqK[b] keys (a KV cache's valid length; n_k is the capacity).
    * VARLEN or SEQ_K: the alignment is bottom-right per sequence (offset + its Nk − Nq).
    * PAGED: keys through BlockTable (kv_loop), K/V are (pages, page_size, Hkv, D).
    * window (HAS_LEFT/HAS_RIGHT), SOFTCAP, ALIBI (Slopes (B, Hq) with batch stride stride_sb,
      0 for (Hq,)), KEY_MASK (KeyMask (B, Nk) strides stride_mb, stride_mn): masks.py.
    * STORE_LSE = False: only Out is written (an inference call that asked for no lse: the plan
      then allocates none, and Lse is any pointer, never written).
    * BLOCK_D2 > 0 (attention_fwd_d2_kernel): HEAD_DIM = BLOCK_D + BLOCK_D2, two powers of two
      (96 = 64 + 32, 192 = 128 + 64): Triton's tiles are powers of two, and one BLOCK_D of 128 or
      256 would spend a third of every product on zero columns. Scores are the two parts' dots
      chained into one accumulator, and each part keeps its own P·V accumulator. K2/V2 are the
      second part's TMA descriptors (ADDR "tma"), else unused (the part's offsets from head dim 0
      are in its own tile offsets)."""
    # A 1-D grid (the y/z grid dims cap at 65535, B·H can exceed it); consecutive programs share a
    # head, so its K/V stay in L2. Causal: the longest rows (last query tiles) start first, so the
    # short tiles fill the tail of the schedule.
    pid = tl.program_id(0)
    bh = pid // m_tiles
    tile = pid % m_tiles
    if HAS_RIGHT and not HAS_LEFT:
        tile = m_tiles - 1 - tile
    b32 = bh // n_heads
    h32 = bh % n_heads
    kvh32 = h32 // group
    b = b32.to(tl.int64)
    h = h32.to(tl.int64)
    kvh = kvh32.to(tl.int64)
    m0 = tile * BLOCK_M

    q_start, seq_q, k_start, seq_k, offset = masks.sequence_bounds(CuQ, CuK, SeqK, b32, n_q, n_k, offset,
                                                                   VARLEN, SEQ_K)
    if VARLEN:  # a tile past its sequence's end (the grid covers the longest) visits no key
        seq_k = tl.where(m0 < seq_q, seq_k, 0)

    rows = m0 + tl.arange(0, BLOCK_M)
    row_ok = rows < seq_q
    d = head_dims(BLOCK_D, SPLIT_D, WIDE)
    d_ok = d < HEAD_DIM
    offs_m = tl.arange(0, BLOCK_M)
    if WIDE:
        offs_m = offs_m.to(tl.int64)
    q_row0 = tl.cast(q_start + m0, tl.int64)
    q_base = Q + b * stride_qb + h * stride_qh + q_row0 * stride_qm
    q = tl.load(q_base + q_offsets(offs_m * stride_qm, d, stride_qd, SPLIT_D),
                mask=q_mask(row_ok, d_ok, EVEN_D, SPLIT_D), other=0.0)
    if BLOCK_D2 > 0:  # the second part's head dims BLOCK_D .. (int64 with WIDE, as d)
        d2 = BLOCK_D + head_dims(BLOCK_D2, 1, WIDE)
        q2 = tl.load(q_base + q_offsets(offs_m * stride_qm, d2, stride_qd, 1), mask=row_ok[:, None], other=0.0)

    if ADDR == "tma":  # K, V are tensor descriptors over (B, Hkv, Nk, D)
        k_src = K
        v_src = V
    elif PAGED:  # the pages' batch stride is the page stride (kv_loop)
        k_src = K + kvh * stride_kh
        v_src = V + kvh * stride_vh
    else:
        k64 = tl.cast(k_start, tl.int64)
        k_src = K + b * stride_kb + kvh * stride_kh + k64 * stride_kn
        v_src = V + b * stride_vb + kvh * stride_vh + k64 * stride_vn
    dv = head_dims(BLOCK_D, 1, WIDE)
    dv_ok = (dv < HEAD_DIM)[None, :]
    k_tile = k_offsets(stride_kn, d, stride_kd, BLOCK_N, SPLIT_D, WIDE)
    v_tile = k_offsets(stride_vn, dv, stride_vd, BLOCK_N, 1, WIDE)
    dk_ok = dk_mask(d_ok, SPLIT_D)
    if BLOCK_D2 > 0:
        if ADDR == "tma":
            k_src2 = K2
            v_src2 = V2
        else:  # the part's offset from head dim 0 is in k_tile2/v_tile2
            k_src2 = k_src
            v_src2 = v_src
        k_tile2 = k_offsets(stride_kn, d2, stride_kd, BLOCK_N, 1, WIDE)
        v_tile2 = k_offsets(stride_vn, d2, stride_vd, BLOCK_N, 1, WIDE)
        acc2 = tl.zeros([BLOCK_M, BLOCK_D2], dtype=tl.float32)
    else:  # never read (kv_loop)
        q2, k_src2, v_src2, k_tile2, v_tile2 = q, k_src, v_src, k_tile, v_tile

    slopes = tl.zeros([BLOCK_M], dtype=tl.float32)
    if ALIBI:
        slopes += tl.load(Slopes + b * stride_sb + h).to(tl.float32) * masks.LOG2E

    m, l = online.identity(BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if BLOCK_D2 == 0:
        acc2 = acc  # never read (kv_loop)
    row_last = tl.minimum(m0 + BLOCK_M, seq_q) - 1
    if VARLEN:  # descriptors over the (1, Hkv, total_k, D) view: the sequence's rows
        tma_b = 0
    else:
        tma_b = b32
    acc, m, l, acc2 = kv_walk(acc, m, l, q, k_src, v_src, k_tile, v_tile, stride_kn, stride_vn, tma_b, kvh32,
                              k_start, rows, dk_ok, dv_ok, 0, seq_k, m0, row_last, seq_k, offset, left, right,
                              qk_scale, slopes, cap_in, cap_out, KeyMask + b * stride_mb, stride_mn,
                              BlockTable + b * stride_tb, PAGE, n_pages, stride_kb, stride_vb, 0, 0,
                              acc2, q2, k_src2, v_src2, k_tile2, v_tile2,
                              HAS_LEFT, HAS_RIGHT, BLOCK_N, BLOCK_D, EVEN_D, PRECISION, UPCAST, RAW, FMA, LATE_L,
                              SPLIT_D, ADDR, SOFTCAP, ALIBI, KEY_MASK, PAGED, 0, BLOCK_D2)

    out = online.attention_out(acc, l, ACCURATE)
    o_base = Out + b * stride_ob + h * stride_oh + q_row0 * stride_om
    o_ptrs = o_base + offs_m[:, None] * stride_om + dv[None, :] * stride_od
    out = to_output(out, Out.dtype.element_ty, UPCAST)
    if EVEN_D:
        tl.store(o_ptrs, out, mask=row_ok[:, None])
    else:
        tl.store(o_ptrs, out, mask=row_ok[:, None] & dv_ok)
    if BLOCK_D2 > 0:
        out2 = to_output(online.attention_out(acc2, l, ACCURATE), Out.dtype.element_ty, UPCAST)
        tl.store(o_base + offs_m[:, None] * stride_om + d2[None, :] * stride_od, out2, mask=row_ok[:, None])
    if STORE_LSE:
        if VARLEN:  # (Hq, total_q), flash-attn's varlen layout
            lse_row0 = h * n_q + q_row0
        else:       # (B, Hq, Nq)
            lse_row0 = bh.to(tl.int64) * n_q + m0
        lse_ptrs = Lse + lse_row0 + tl.arange(0, BLOCK_M)
        tl.store(lse_ptrs, online.lse(m, l, finish_scale(qk_scale, RAW), ACCURATE), mask=row_ok)


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
        WIDE: tl.constexpr, RAW: tl.constexpr, FMA: tl.constexpr, LATE_L: tl.constexpr,
        SPLIT_D: tl.constexpr, ACCURATE: tl.constexpr, ADDR: tl.constexpr, STORE_LSE: tl.constexpr = True):
    """Dense attention (no window but causal, no score modification): the fewest launch arguments,
    so the host's launch cost of the common call stays what it was (tiled_attn/triton/launch.py)."""
    fwd_program(Q, K, V, Out, Lse, Lse, Lse, Lse, Lse, Lse, Lse, K, V,
                stride_qb, stride_qh, stride_qm, stride_qd,
                stride_kb, stride_kh, stride_kn, stride_kd,
                stride_vb, stride_vh, stride_vn, stride_vd,
                stride_ob, stride_oh, stride_om, stride_od,
                0, 0, 0, 0, 1,
                n_heads, group, n_q, n_k, causal_offset, 0, 0, qk_scale, 1.0, 1.0, m_tiles,
                False, CAUSAL, BLOCK_M, BLOCK_N, HEAD_DIM, BLOCK_D, EVEN_D, PRECISION, UPCAST, WIDE, RAW,
                FMA, LATE_L, SPLIT_D, ACCURATE, ADDR, False, False, 0, False, False, False, 1, STORE_LSE, 0)


@triton.jit(do_not_specialize=["n_q", "n_k", "causal_offset", "m_tiles"])
def attention_fwd_d2_kernel(
        Q, K, V, K2, V2, Out, Lse,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_om, stride_od,
        n_heads, group, n_q, n_k, causal_offset, qk_scale, m_tiles,
        CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
        WIDE: tl.constexpr, RAW: tl.constexpr, FMA: tl.constexpr, LATE_L: tl.constexpr,
        ADDR: tl.constexpr, STORE_LSE: tl.constexpr = True):
    """attention_fwd_kernel with the head dim in two power-of-two parts, HEAD_DIM = BLOCK_D +
    BLOCK_D2 (fwd_program's doc); 16-bit inputs. K2/V2: the second part's TMA descriptors with
    ADDR "tma", else any tensor (never read)."""
    tl.static_assert(HEAD_DIM == BLOCK_D + BLOCK_D2)
    fwd_program(Q, K, V, Out, Lse, Lse, Lse, Lse, Lse, Lse, Lse, K2, V2,
                stride_qb, stride_qh, stride_qm, stride_qd,
                stride_kb, stride_kh, stride_kn, stride_kd,
                stride_vb, stride_vh, stride_vn, stride_vd,
                stride_ob, stride_oh, stride_om, stride_od,
                0, 0, 0, 0, 1,
                n_heads, group, n_q, n_k, causal_offset, 0, 0, qk_scale, 1.0, 1.0, m_tiles,
                False, CAUSAL, BLOCK_M, BLOCK_N, HEAD_DIM, BLOCK_D, True, PRECISION, UPCAST, WIDE, RAW,
                FMA, LATE_L, 1, False, ADDR, False, False, 0, False, False, False, 1, STORE_LSE, BLOCK_D2)


@triton.jit(do_not_specialize=["n_q", "n_k", "offset", "left", "right", "m_tiles", "n_pages"])
def attention_fwd_ext_kernel(
        Q, K, V, Out, Lse, Slopes, KeyMask, CuQ, CuK, SeqK, BlockTable,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_om, stride_od,
        stride_sb, stride_mb, stride_mn, stride_tb, n_pages,
        n_heads, group, n_q, n_k, offset, left, right, qk_scale, cap_in, cap_out, m_tiles,
        HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr,
        UPCAST: tl.constexpr, WIDE: tl.constexpr, RAW: tl.constexpr, FMA: tl.constexpr,
        LATE_L: tl.constexpr, SPLIT_D: tl.constexpr, ACCURATE: tl.constexpr, ADDR: tl.constexpr,
        SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, KEY_MASK: tl.constexpr, VARLEN: tl.constexpr,
        SEQ_K: tl.constexpr, PAGED: tl.constexpr, PAGE: tl.constexpr, STORE_LSE: tl.constexpr = True):
    """The forward with windows, score modifications, packed sequences or a (paged) KV cache
    (fwd_program's doc); unused pointers are any tensor (never read)."""
    fwd_program(Q, K, V, Out, Lse, Slopes, KeyMask, CuQ, CuK, SeqK, BlockTable, K, V,
                stride_qb, stride_qh, stride_qm, stride_qd,
                stride_kb, stride_kh, stride_kn, stride_kd,
                stride_vb, stride_vh, stride_vn, stride_vd,
                stride_ob, stride_oh, stride_om, stride_od,
                stride_sb, stride_mb, stride_mn, stride_tb, n_pages,
                n_heads, group, n_q, n_k, offset, left, right, qk_scale, cap_in, cap_out, m_tiles,
                HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N, HEAD_DIM, BLOCK_D, EVEN_D, PRECISION, UPCAST, WIDE,
                RAW, FMA, LATE_L, SPLIT_D, ACCURATE, ADDR, SOFTCAP, ALIBI, KEY_MASK, VARLEN, SEQ_K, PAGED, PAGE,
                STORE_LSE, 0)
