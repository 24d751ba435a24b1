"""The online-softmax state in Triton: the one place the recurrence of DESIGN §1 is written.

A state is a pair of row vectors `(m, l)` of shape [BLOCK_M]: `m` the running max, `l` the sum of
`exp(x − m)`. Tiles are [BLOCK_M, BLOCK_N] and reduce along axis 1, so the same verbs serve the
softmax kernels (BLOCK_M rows of a matrix) and the attention kernels (BLOCK_M queries × BLOCK_N keys).

`scale` is the factor applied *after* the subtraction, inside the exponential: exp(x − m) is computed
as exp2((x − m)·scale). The softmax kernels pass LOG2E on raw inputs, so x − m is exact-ish for
nearby values and ±1e4 logits keep full float32 precision. The attention kernels pre-multiply the
scores by sm_scale·LOG2E (one multiply per score, FlashAttention's exp2 trick) and pass scale = 1.0;
their `m` is then in log2 units and `lse()` converts back to natural units.

Every verb guards a max of -inf (a row that has seen only -inf or only masked keys) by shifting by 0
instead, so exp2(-inf − 0) = 0 and no NaN appears; `normalize` keeps torch.softmax's NaN for a row
of only -inf (0/0), while `attention_out` gives the fully-masked-row contract (0, lse = -inf).

Two optional constexpr switches (defaults keep every existing caller's code unchanged):
* FMA (update, update_max): evaluate exp2((x − m)·scale) as exp2(x·scale − m·scale), one fused
  multiply-add per element instead of a subtract and a multiply (the FMA form the Triton tutorial and
  FlexAttention use; it needs scale > 0, as the verbs' max does anyway). One rounding instead of two,
  so it is at least as accurate.
* ACCURATE: for float32 outputs, where the numerics rule compares against torch's float32
  (DESIGN §4); the 16-bit paths keep the fast forms (their eps dwarfs a float32 ulp).
  - attention_out, lse: IEEE round-to-nearest division (div.rn rather than Triton's default
    div.full.f32, 2 ulp) and lse = m·scale·ln2 + ln(l) as one FMA over an accurate log (Triton 3.6
    lowers tl.log and tl.math.log2 to libdevice's polynomials, not lg2.approx).
  - the softmax verbs (update, update_max, merge, merge_parts, merge_many, normalize), which then
    require scale = LOG2E (inputs in natural units): e^d by `exp_natural`, the form of CUDA's expf
    (what torch.softmax calls), and normalize multiplies by a reciprocal of l rounded once (≤ 1
    ulp) instead of dividing with div.full.f32 (2 ulp). Measured on the H100 before this switch,
    the fast forms (exp2(d·LOG2E) with Triton's div) left a 7x300 float32 softmax 2.2e-7 off the
    float64 result where torch was 2e-8 off: outside DESIGN §4's 2× torch + eps.
  - the running sum l is float64 in the kernels that fold several tiles (identity(..., ACCURATE)
    makes it so, update_sum and merge_parts keep it; the row kernel's one tile has no running sum
    and keeps float32, its registers measured at 94 vs 112 per thread on sm_90a for 512 columns):
    a float32 l rounds once per tile folded in, and the one term that matters most in a
    peaked row, the max's exp(0) = 1, passes through every one of those roundings. With 16-column
    tiles a 1 × 100 row at 3·randn took 7 of them, and the largest output ended up 2.9 ulps off
    where torch.softmax (one pass over the row) was 0.1 ulp off: 1.27× the numerics rule's bound,
    in 2 of 400 fresh seeds of tests/test_softmax.py::test_triton_tiny_tiles[online-1-100] (issue
    16). The same sequential sum over tiles is what a long row does with the real tile sizes. The
    cost is one float64 multiply-add per row per tile, not per element (not yet timed on the H100;
    sm_90a builds: no spills); the CUDA kernels took the same step (csrc/online_softmax.cuh: double
    sums, CompensatedState). What is left is each tile's float32 tree sum: over 1750 fresh draws
    of the tiny-tile cases afterwards the worst used 0.998 of the bound (a draw where torch's own
    error was 2.6e-10), the next 0.68.

LOG (normalize): the log-softmax finalize, (x − m) − ln l (softmax kernels only: inputs in natural
units, scale = LOG2E). The difference comes first, as torch.log_softmax computes it: x − m is exact
for nearby values and the result is rounded twice, not once against a rounded lse = m + ln l, whose
own rounding (half an ulp of |m|, 5e-4 at m = 1e4) would land on every output of the row.
"""
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
# log2(e) as a float32 and the float32 nearest to its remainder: d·log2(e) = d·_LOG2E_HI + d·_LOG2E_LO
# to ~2^-48 relative, the two-part product of CUDA's expf.
_LOG2E_HI = tl.constexpr(1.44269502162933349609375)
_LOG2E_LO = tl.constexpr(1.925963033500011079e-08)
# A constexpr: lse() reads it inside @triton.jit, where plain Python globals fail to compile.
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def finite_or_zero(m):
    """The shift to subtract: m itself, or 0 where m is -inf (nothing but -inf seen yet)."""
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def exp_natural(d):
    """e^d for float32 d, with d·log2(e) carried in two parts as CUDA's expf does (what
    torch.softmax calls): a = d·log2e rounded, r = the product's exact remainder (one FMA) plus d
    times log2(e)'s own float32 remainder (another), e^d = 2^a·2^r = 2^a + 2^a·r·ln2 (|r| < 2^-16,
    so the dropped r² term is below 2^-33 relative). exp2(d·LOG2E) alone is off by ln2·|a|·2^-24
    relative from the rounded product. d is clamped at -104 first (e^-104 is below the smallest
    float32 denormal), so -inf gives 0 and never inf − inf; NaN stays NaN."""
    d = tl.maximum(d, -104.0, propagate_nan=tl.PropagateNan.ALL)
    a = d * _LOG2E_HI
    r = tl.math.fma(d, _LOG2E_LO, tl.math.fma(d, _LOG2E_HI, -a))
    e = tl.math.exp2(a)
    return tl.math.fma(e, r * LN2, e)


@triton.jit
def _exp_scaled(d, scale, ACCURATE: tl.constexpr):
    """exp2(d·scale); ACCURATE: e^d by exp_natural (the caller's scale is LOG2E)."""
    if ACCURATE:
        e = exp_natural(d)
    else:
        e = tl.math.exp2(d * scale)
    return e


@triton.jit
def identity(BLOCK_M: tl.constexpr, ACCURATE: tl.constexpr = False):
    """The state of an empty row: m = -inf, l = 0 (l in float64 with ACCURATE: see above)."""
    if ACCURATE:
        l = tl.zeros([BLOCK_M], tl.float64)
    else:
        l = tl.zeros([BLOCK_M], tl.float32)
    return tl.full([BLOCK_M], float("-inf"), tl.float32), l


@triton.jit
def update_max(m, x, scale, FMA: tl.constexpr = False, ACCURATE: tl.constexpr = False):
    """The max half of `update`: m' = max(m, max(x)), p = exp(x − m'), alpha = exp(m − m').

    Split from the sum so an attention kernel can fold Σp into l after issuing its P·V product
    (update_sum), letting the row sum overlap the matrix multiply. Returns (m', p, alpha).
    """
    m_new = tl.maximum(m, tl.max(x, axis=1))
    shift = finite_or_zero(m_new)
    alpha = _exp_scaled(m - shift, scale, ACCURATE)
    if FMA:
        p = tl.math.exp2(tl.math.fma(x, scale, -(shift * scale)[:, None]))
    else:
        p = _exp_scaled(x - shift[:, None], scale, ACCURATE)
    return m_new, p, alpha


@triton.jit
def update_sum(l, p, alpha):
    """The sum half of `update`: l' = l·alpha + Σp, in l's type (float64 from identity(ACCURATE):
    the tile's own sum stays a float32 tree, the running sum across tiles never rounds to float32)."""
    return l * alpha.to(l.dtype) + tl.sum(p, axis=1).to(l.dtype)


@triton.jit
def update(m, l, x, scale, FMA: tl.constexpr = False, ACCURATE: tl.constexpr = False):
    """Fold a tile x [BLOCK_M, BLOCK_N] into (m, l).

    m' = max(m, max(x)),  l' = l·exp(m − m') + Σ exp(x − m').
    Returns (m', l', p, alpha) with p = exp(x − m') (the attention kernels multiply it into V) and
    alpha = exp(m − m') (the factor that rescales an output accumulator).
    """
    m_new, p, alpha = update_max(m, x, scale, FMA, ACCURATE)
    return m_new, update_sum(l, p, alpha), p, alpha


@triton.jit
def merge(m1, l1, m2, l2, scale, ACCURATE: tl.constexpr = False):
    """m = max(m1, m2),  l = l1·exp(m1 − m) + l2·exp(m2 − m). Returns (m, l, alpha1, alpha2)."""
    m = tl.maximum(m1, m2)
    shift = finite_or_zero(m)
    a1 = _exp_scaled(m1 - shift, scale, ACCURATE)
    a2 = _exp_scaled(m2 - shift, scale, ACCURATE)
    return m, l1 * a1 + l2 * a2, a1, a2


@triton.jit
def merge_parts(m_parts, l_parts, scale, ACCURATE: tl.constexpr = False):
    """Merge states laid out along axis 1 ([BLOCK_M, SPLITS], unused splits = identity).

    Returns (m, l, a) with a = exp(m_parts − m) [BLOCK_M, SPLITS], the factor that rescales each
    part's output accumulator."""
    m = tl.max(m_parts, axis=1)
    shift = finite_or_zero(m)
    a = _exp_scaled(m_parts - shift[:, None], scale, ACCURATE)
    if ACCURATE:  # l in float64, as identity(ACCURATE) makes it
        l = tl.sum(l_parts.to(tl.float64) * a.to(tl.float64), axis=1)
    else:
        l = tl.sum(l_parts * a, axis=1)
    return m, l, a


@triton.jit
def merge_many(m_parts, l_parts, scale, ACCURATE: tl.constexpr = False):
    """Merge states laid out along axis 1 ([BLOCK_M, SPLITS], unused splits = identity)."""
    m, l, _ = merge_parts(m_parts, l_parts, scale, ACCURATE)
    return m, l


@triton.jit
def _div(x, y, ACCURATE: tl.constexpr):
    if ACCURATE:
        q = tl.math.div_rn(x, y)
    else:
        q = x / y
    return q


@triton.jit
def normalize(x, m, l, scale, ACCURATE: tl.constexpr = False, LOG: tl.constexpr = False):
    """Softmax finalize: y = exp(x − m) / l; LOG: log-softmax, y = (x − m) − ln l (scale = LOG2E).
    A row of only -inf gives NaN, as torch.softmax and torch.log_softmax do (0 · 1/0 with
    ACCURATE, 0/0 without; -inf − ln 0 = -inf − (-inf) for LOG)."""
    if LOG:
        # ln l once per row in float64, rounded to float32 once (libdevice's log). A float32
        # log (tl.log or log2·ln2) left ptxas at 64 registers with a spill in the 512-column bf16
        # row kernel (sm_90a); the float64 one does not spill, and costs one log per row.
        lnl = tl.log(l.to(tl.float64)).to(tl.float32)
        y = (x - finite_or_zero(m)[:, None]) - lnl[:, None]
    else:
        y = divide_by_sum(_exp_scaled(x - finite_or_zero(m)[:, None], scale, ACCURATE), l, ACCURATE)
    return y


@triton.jit
def divide_by_sum(p, l, ACCURATE: tl.constexpr = False):
    """normalize's last step, y = p / l, for p = exp(x − m) of the final m. A kernel whose row is one
    tile passes update's own p (the same shift, the same exponential: the same values normalize
    computes from x), so each element's exponential is taken once, not twice."""
    if ACCURATE:
        # One correctly rounded reciprocal per row, then a multiply: ≤ 1 ulp, per element far
        # cheaper than div.rn. A float64 l (identity(ACCURATE)) is inverted in float64 and
        # rounded once; a float32 one (the row kernel's single-tile sum: no running sum to
        # keep) by div.rn, without float64 registers.
        if l.dtype == tl.float64:
            inv = (1.0 / l).to(tl.float32)
        else:
            inv = tl.math.div_rn(tl.full(l.shape, 1.0, tl.float32), l)
        y = p * inv[:, None]
    else:
        y = p / l[:, None]
    return y


@triton.jit
def attention_out(acc, l, ACCURATE: tl.constexpr = False):
    """Attention finalize: acc / l, and 0 for a row with no visible key (l = 0)."""
    empty = l == 0.0
    return tl.where(empty[:, None], 0.0, _div(acc, tl.where(empty, 1.0, l)[:, None], ACCURATE))


@triton.jit
def probs(x, lse, scale):
    """The finalize of a finished state, as the attention backward recomputes P: p = exp(x − m)/l
    = exp(x − lse) with lse = m + log l, here exp2(x·scale − lse) as one FMA (lse in the units of
    x·scale, shaped to broadcast against x). A row that saw no key (lse = −inf) gives p = 0."""
    shift = tl.where(lse == float("-inf"), float("inf"), lse)
    return tl.math.exp2(tl.math.fma(x, scale, -shift))


@triton.jit
def lse(m, l, scale, ACCURATE: tl.constexpr = False):
    """Natural-log sum of exp of the scaled scores: (m·scale + log2 l)·ln2; -inf where l = 0.

    `scale` is the one the state was built with (LOG2E for raw inputs, 1.0 for log2-unit scores),
    so m·scale is in log2 units. ACCURATE: fma(m, scale·ln2, ln l), two roundings of the result's
    magnitude instead of three.
    """
    if ACCURATE:
        value = tl.math.fma(finite_or_zero(m), scale * LN2, tl.log(l))
    else:
        value = (finite_or_zero(m) * scale + tl.math.log2(l)) * LN2
    return tl.where(l == 0.0, float("-inf"), value)
