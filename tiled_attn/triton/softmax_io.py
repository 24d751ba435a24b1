"""Tile addressing shared by the softmax kernels: 64-bit row bases, 32-bit column offsets.

A row's base address is `ptr + row·stride_m` computed in int64 (row·stride can pass 2^31 elements:
a (2^31/N + 2) × N tensor). Inside a row the column offsets stay int32 when the columns are
contiguous (`COL_CONTIG`, set by the wrapper when stride_n == 1), so the hot loop does no 64-bit
math beyond the one pointer add per element and Triton sees unit stride and vectorizes the loads
into 16-byte packs. Strided columns (a transposed view) widen to int64: col·stride_n can pass 2^31.

Rows of 2^31 columns or more (backend=None takes rows of any length): N then arrives as an int64
argument (Triton types an integer argument by its value), and every column index the kernels form
from it (tile counts, a split chunk's start s·CHUNK, taken in N's type by softmax_split._chunk) is
int64 with it. Rows below 2^31 columns keep int32 indices: each one the kernels form stays below
⌈N/BLOCK_N⌉·BLOCK_N ≤ 2^31 (BLOCK_N and CHUNK are multiples of a power of two that divides 2^31;
chunk ends are formed as start + min(N − start, CHUNK), never start + CHUNK). Measured on sm_90a
builds: int64 columns on every row would cost the strided split_sync builds 16 registers and spills
under their maxnreg = 80.

`MASK_N` drops the column mask on full tiles: a mask whose constancy Triton cannot prove (N not a
multiple of 16) would break the 16-byte packs for the whole row, so kernels walk full tiles unmasked
and only the tail tile masked.

Cache hints are constexpr strings ("" = none) that the wrapper derives from a config's EVICT switch
(softmax.py:_hints): `EVICT` is a load's L2 eviction priority ("evict_last" for data a later pass
re-reads, "evict_first" for a last use), `CACHE` a store's cache operator (".cs": streaming; the
output is not read back, so its lines leave L2 first and keep the input that a second pass re-reads).
"""
import triton
import triton.language as tl

from . import online
from .attention_fwd import bf16_grid
from .launch import interpreted

# The online verbs take the exp2 scale as an argument; the softmax kernels pass LOG2E on raw inputs.
# A @triton.jit function may read a global only if it is a tl.constexpr (online.LOG2E is a plain
# float, which the interpreter accepts but the compiler rejects).
LOG2E = tl.constexpr(online.LOG2E)
# The "no hint" default of the cache-hint parameters: a plain "" default reaches tl.load unwrapped
# and fails to compile; a constexpr one does not.
_NONE = tl.constexpr("")


def vec_width(esize: int, n: int, *row_strides: int) -> int:
    """The largest power of two of elements, at most 16 bytes, that divides N and every row stride
    (host side, for a kernel's VEC: the divisibility Triton's own specialization, by 16, misses)."""
    vec = max(1, 16 // esize)
    while vec > 1 and any(v % vec for v in (n, *row_strides)):
        vec //= 2
    return vec


@triton.jit
def row_base(ptr, rows, stride_m):
    """[BLOCK_M] pointers to the first element of each row, offset in int64."""
    return ptr + rows.to(tl.int64) * stride_m


@triton.jit
def tile_ptrs(base, cols, stride_n, COL_CONTIG: tl.constexpr):
    """[BLOCK_M, BLOCK_N] pointers from row bases [BLOCK_M] and column indices [BLOCK_N]."""
    if COL_CONTIG:
        return base[:, None] + cols[None, :]
    else:
        return base[:, None] + cols.to(tl.int64)[None, :] * stride_n


@triton.jit
def tile_mask(row_mask, cols, N, MASK_N: tl.constexpr):
    if MASK_N:
        return row_mask[:, None] & (cols < N)[None, :]
    else:
        return row_mask[:, None]  # tl.load/tl.store broadcast it along the columns


@triton.jit
def load_tile(base, cols, stride_n, row_mask, N, other, COL_CONTIG: tl.constexpr,
              MASK_N: tl.constexpr, EVICT: tl.constexpr = _NONE):
    """Load a tile as float32 (accumulation type); masked-out entries read `other`."""
    ptrs = tile_ptrs(base, cols, stride_n, COL_CONTIG)
    return tl.load(ptrs, mask=tile_mask(row_mask, cols, N, MASK_N), other=other,
                   eviction_policy=EVICT).to(tl.float32)


@triton.jit
def store_masked(ptrs, value, mask, CACHE: tl.constexpr = _NONE):
    """tl.store rounding `value` to the pointers' dtype (the GPU's rounding, also in the interpreter)."""
    if _INTERPRETED and ptrs.dtype.element_ty == tl.bfloat16:
        value = bf16_grid(value)  # round to nearest even, as the GPU's conversion does
    tl.store(ptrs, value.to(ptrs.dtype.element_ty), mask=mask, cache_modifier=CACHE)


@triton.jit
def store_tile(base, cols, row_mask, N, value, MASK_N: tl.constexpr, CACHE: tl.constexpr = _NONE):
    """Store into a row-major output (unit column stride), rounding to the output's dtype."""
    store_masked(base[:, None] + cols[None, :], value, tile_mask(row_mask, cols, N, MASK_N), CACHE)


# Triton 3.6's interpreter converts float32 to bfloat16 toward zero; the GPU's conversion rounds
# to nearest even. In the interpreter, store_tile rounds to the bfloat16 grid first, so CPU runs
# see the GPU's rounding: a log-softmax output near −20 was otherwise up to a whole ulp (0.125)
# off where torch is within half of one, past DESIGN §4's 2× torch + eps. No code on the GPU.
_INTERPRETED = tl.constexpr(interpreted(store_tile))

