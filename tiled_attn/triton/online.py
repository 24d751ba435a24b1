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
* ACCURATE (normalize, attention_out, lse): IEEE round-to-nearest division (div.rn rather than
  Triton's default div.full.f32, 2 ulp) and lse = m·scale·ln2 + ln(l) as one FMA over an accurate
  log (Triton 3.6 lowers tl.log and tl.math.log2 to libdevice's polynomials, not lg2.approx). For
  float32 inputs, where the numerics rule compares against torch's float32 (DESIGN §4); the 16-bit
  paths keep the fast forms (their eps dwarfs a float32 ulp). exp2 has no more accurate form on
  NVIDIA GPUs (libdevice's exp2f is the same ex2.approx.ftz instruction, 2 ulp; checked in the
  sm_90a PTX).
"""
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
# A constexpr: lse() reads it inside @triton.jit, where plain Python globals fail to compile.
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def finite_or_zero(m):
    """The shift to subtract: m itself, or 0 where m is -inf (nothing but -inf seen yet)."""
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def identity(BLOCK_M: tl.constexpr):
    """The state of an empty row: m = -inf, l = 0."""
    return (tl.full([BLOCK_M], float("-inf"), tl.float32), tl.zeros([BLOCK_M], tl.float32))


@triton.jit
def update_max(m, x, scale, FMA: tl.constexpr = False):
    """The max half of `update`: m' = max(m, max(x)), p = exp(x − m'), alpha = exp(m − m').

    Split from the sum so an attention kernel can fold Σp into l after issuing its P·V product
    (update_sum), letting the row sum overlap the matrix multiply. Returns (m', p, alpha).
    """
    m_new = tl.maximum(m, tl.max(x, axis=1))
    shift = finite_or_zero(m_new)
    alpha = tl.math.exp2((m - shift) * scale)
    if FMA:
        p = tl.math.exp2(tl.math.fma(x, scale, -(shift * scale)[:, None]))
    else:
        p = tl.math.exp2((x - shift[:, None]) * scale)
    return m_new, p, alpha


@triton.jit
def update_sum(l, p, alpha):
    """The sum half of `update`: l' = l·alpha + Σp."""
    return l * alpha + tl.sum(p, axis=1)


@triton.jit
def update(m, l, x, scale, FMA: tl.constexpr = False):
    """Fold a tile x [BLOCK_M, BLOCK_N] into (m, l).

    m' = max(m, max(x)),  l' = l·exp(m − m') + Σ exp(x − m').
    Returns (m', l', p, alpha) with p = exp(x − m') (the attention kernels multiply it into V) and
    alpha = exp(m − m') (the factor that rescales an output accumulator).
    """
    m_new, p, alpha = update_max(m, x, scale, FMA)
    return m_new, update_sum(l, p, alpha), p, alpha


@triton.jit
def merge(m1, l1, m2, l2, scale):
    """m = max(m1, m2),  l = l1·exp(m1 − m) + l2·exp(m2 − m). Returns (m, l, alpha1, alpha2)."""
    m = tl.maximum(m1, m2)
    shift = finite_or_zero(m)
    a1 = tl.math.exp2((m1 - shift) * scale)
    a2 = tl.math.exp2((m2 - shift) * scale)
    return m, l1 * a1 + l2 * a2, a1, a2


@triton.jit
def merge_parts(m_parts, l_parts, scale):
    """Merge states laid out along axis 1 ([BLOCK_M, SPLITS], unused splits = identity).

    Returns (m, l, a) with a = exp(m_parts − m) [BLOCK_M, SPLITS], the factor that rescales each
    part's output accumulator."""
    m = tl.max(m_parts, axis=1)
    shift = finite_or_zero(m)
    a = tl.math.exp2((m_parts - shift[:, None]) * scale)
    return m, tl.sum(l_parts * a, axis=1), a


@triton.jit
def merge_many(m_parts, l_parts, scale):
    """Merge states laid out along axis 1 ([BLOCK_M, SPLITS], unused splits = identity)."""
    m, l, _ = merge_parts(m_parts, l_parts, scale)
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
    """Softmax finalize: y = exp(x − m) / l. A row of only -inf gives NaN, as torch.softmax does."""
    return _div(tl.math.exp2((x - finite_or_zero(m)[:, None]) * scale), l[:, None], ACCURATE)


@triton.jit
def attention_out(acc, l, ACCURATE: tl.constexpr = False):
    """Attention finalize: acc / l, and 0 for a row with no visible key (l = 0)."""
    empty = l == 0.0
    return tl.where(empty[:, None], 0.0, _div(acc, tl.where(empty, 1.0, l)[:, None], ACCURATE))


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
