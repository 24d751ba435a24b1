"""What a score becomes before the online softmax sees it, and which key tiles a query tile visits.

One place for the score model of DESIGN §3, shared by the forward, decode and backward kernels.
For query i and key j of one (sequence, head), with `offset` the alignment (Nk − Nq: bottom-right;
0: torch's top-left is_causal), in natural units:
    s = scale·q·k                        then, each only where its constexpr is on,
    s = c·tanh(s / c)                    SOFTCAP (Gemma 2)
    s = s − slope·|i + offset − j|       ALIBI
    s = −inf where key_mask[j] is False   KEY_MASK = 1 (bool), or s + key_mask[j] for KEY_MASK = 2
    s = −inf unless i + offset − left <= j <= i + offset + right   HAS_LEFT / HAS_RIGHT (a window;
                                                                   causal is right = 0)
The kernels keep scores in log2 units (s·log2 e) so the verbs use exp2; every bias here is
multiplied by LOG2E accordingly.

Tile skipping (`kv_ranges`): for a query tile of rows [row_first, row_last], keys are walked in
three ranges: a masked head [start, full_lo) (keys some row's window starts inside), the unmasked
middle [full_lo, full_hi) (every row sees every key: no mask, no bounds checks), and a masked tail
[full_hi, end) (the causal/right edge and the ragged end of the keys). Keys outside [start, end) are
never visited, so a window of w keys costs O(w) per row, not O(Nk).
"""
import triton
import triton.language as tl

from . import online

LOG2E = tl.constexpr(1.4426950408889634)
# tanh below this magnitude comes from its odd Taylor series (to x^21: < 1e-9 relative at 0.55),
# above it from exp: 1 − 2/(e^{2x} + 1) has no cancellation once tanh >= 0.5. Triton 3.6's
# interpreter has no libdevice tanh, and one formula for both keeps the CPU tests on the GPU's
# numerics.
_TANH_SERIES = tl.constexpr(0.55)


@triton.jit
def tanh(x):
    """tanh of a float32 tile, to a few float32 ulps (see _TANH_SERIES)."""
    a = tl.abs(x)
    z = a * a
    # tanh(a) = a·(1 + z·P(z)), the Taylor coefficients of tanh.
    p = -0.00023912911424355248 + z * 9.691537956929451e-05
    p = 0.000590027440945586 + z * p
    p = -0.0014558343870513183 + z * p
    p = 0.003592128036572481 + z * p
    p = -0.008863235529902197 + z * p
    p = 0.021869488536155203 + z * p
    p = -0.05396825396825397 + z * p
    p = 0.13333333333333333 + z * p
    p = -0.3333333333333333 + z * p
    small = a + a * (z * p)
    # e^{2a} by the two-part exp and a correctly rounded division. Measured in the interpreter:
    # at most 1.7e-7 relative (where the branches meet, tanh ~ 0.5), torch's float32 tanh 6e-8.
    e = online.exp_natural(2.0 * tl.minimum(a, 40.0))
    large = 1.0 - tl.math.div_rn(tl.full(e.shape, 2.0, tl.float32), e + 1.0)
    t = tl.where(a < _TANH_SERIES, small, large)
    return tl.where(x < 0, -t, t)


@triton.jit
def tanh_fast(x):
    """tanh to ~1e-7 absolute (not relative) with one exp2 and one fast division: 1 − 2/(e^{2x}+1).
    For 16-bit inputs, whose P is rounded to 8-11 bits anyway (measured on the H100: the accurate
    tanh made a softcapped causal forward 4.8x slower than without softcap)."""
    e = tl.math.exp2(tl.minimum(x, 40.0) * (2.0 * LOG2E))
    return 1.0 - 2.0 / (e + 1.0)


@triton.jit
def softcap(s, cap_in, cap_out, ACCURATE: tl.constexpr = True):
    """c·tanh(s_nat / c) in log2 units from the raw product s = q·k: cap_in = scale / c,
    cap_out = c·log2 e. Returns (capped scores, tanh) — the backward's chain factor is 1 − tanh².
    ACCURATE (float32 inputs): tanh to a few ulps; else tanh_fast."""
    if ACCURATE:
        t = tanh(s * cap_in)
    else:
        t = tanh_fast(s * cap_in)
    return t * cap_out, t


@triton.jit
def alibi(s, rows, cols, offset, slopes):
    """s − slope·|i + offset − j| with slopes [BLOCK_M] already in log2 units (slope·log2 e)."""
    dist = tl.abs(rows[:, None] + offset - cols[None, :]).to(tl.float32)
    return s - slopes[:, None] * dist


@triton.jit
def visible(rows, cols, key_ok, offset, left, right, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """[BLOCK_M, BLOCK_N]: key j is in range (key_ok) and inside row i's window."""
    vis = key_ok[None, :]
    if HAS_RIGHT:
        vis = vis & (cols[None, :] <= rows[:, None] + (offset + right))
    if HAS_LEFT:
        vis = vis & (cols[None, :] >= rows[:, None] + (offset - left))
    return vis


@triton.jit
def kv_ranges(lo, hi, row_first, row_last, offset, left, right,
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, BLOCK_N: tl.constexpr):
    """Split keys [lo, hi) (lo a multiple of BLOCK_N) for query rows row_first..row_last into
    (start, full_lo, full_hi, end): masked [start, full_lo), unmasked [full_lo, full_hi), masked
    [full_hi, end); keys outside [start, end) are invisible to every row. start, full_lo and
    full_hi are lo plus multiples of BLOCK_N (or end), so each range's tiles stay aligned."""
    start = lo
    end = hi
    if HAS_LEFT:
        start = tl.maximum(lo, tl.minimum(hi, row_first + offset - left))
    if HAS_RIGHT:
        end = tl.maximum(start, tl.minimum(hi, row_last + offset + right + 1))
    start = lo + ((start - lo) // BLOCK_N) * BLOCK_N
    # Keys every row sees: [row_last + offset − left, row_first + offset + right].
    full_lo = start
    if HAS_LEFT:
        first_all = tl.maximum(row_last + offset - left, start)
        full_lo = tl.minimum(start + ((first_all - start + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, end)
    full_hi = end
    if HAS_RIGHT:
        full_hi = tl.maximum(tl.minimum(end, row_first + offset + right + 1), full_lo)
    full_hi = tl.maximum(full_lo, full_lo + ((full_hi - full_lo) // BLOCK_N) * BLOCK_N)
    return start, full_lo, full_hi, end


@triton.jit
def sequence_bounds(CuQ, CuK, SeqK, b32, n_q, n_k, offset, VARLEN: tl.constexpr, SEQ_K: tl.constexpr):
    """(q_start, seq_q, k_start, seq_k, offset) of batch b (b32): with VARLEN, packed sequence b's
    rows CuQ[b]..CuQ[b+1] of the n_q query rows and CuK[b]..CuK[b+1] of the n_k key rows; with
    SEQ_K, SeqK[b] keys of the n_k capacity; else everything. The alignment becomes bottom-right
    per sequence (offset + its Nk − Nq). Every bound is clamped into [0, n_q] / [0, n_k] and made
    non-decreasing, so values the host did not check (graph capture, torch.compile) read wrong rows,
    never out of bounds."""
    q_start = 0
    k_start = 0
    seq_q = n_q
    seq_k = n_k
    if VARLEN:
        q_start = tl.minimum(tl.maximum(tl.load(CuQ + b32), 0), n_q)
        seq_q = tl.minimum(tl.maximum(tl.load(CuQ + b32 + 1), q_start), n_q) - q_start
        k_start = tl.minimum(tl.maximum(tl.load(CuK + b32), 0), n_k)
        seq_k = tl.minimum(tl.maximum(tl.load(CuK + b32 + 1), k_start), n_k) - k_start
    elif SEQ_K:
        seq_k = tl.minimum(tl.maximum(tl.load(SeqK + b32), 0), n_k)
    if VARLEN or SEQ_K:
        offset = offset + seq_k - seq_q
    return q_start, seq_q, k_start, seq_k, offset
