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
    (what torch.softmax calls), and normalize multiplies by a div.rn reciprocal of l (≤ 1 ulp)
    instead of dividing with div.full.f32 (2 ulp). Measured on the H100 before this switch, the
    fast forms (exp2(d·LOG2E) with Triton's div) left a 7x300 float32 softmax 2.2e-7 off the
    float64 result where torch was 2e-8 off: outside DESIGN §4's 2× torch + eps.
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
def identity(BLOCK_M: tl.constexpr):
    """The state of an empty row: m = -inf, l = 0."""
    return (tl.full([BLOCK_M], float("-inf"), tl.float32), tl.zeros([BLOCK_M], tl.float32))


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
    """The sum half of `update`: l' = l·alpha + Σp."""
    return l * alpha + tl.sum(p, axis=1)


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
    return m, tl.sum(l_parts * a, axis=1), a


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
def normalize(x, m, l, scale, ACCURATE: tl.constexpr = False):
    """Softmax finalize: y = exp(x − m) / l. A row of only -inf gives NaN, as torch.softmax does
    (0 · 1/0 with ACCURATE, 0/0 without)."""
    p = _exp_scaled(x - finite_or_zero(m)[:, None], scale, ACCURATE)
    if ACCURATE:
        # One correctly rounded reciprocal per row, then a multiply: ≤ 1 ulp, per element far
        # cheaper than div.rn.
        y = p * tl.math.div_rn(tl.full(l.shape, 1.0, tl.float32), l)[:, None]
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
