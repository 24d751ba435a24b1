"""Split-row softmax for few, huge rows: S programs per row, so M = 1 still fills every SM.

Adds over the online kernel: the columns of a row are cut into S chunks of CHUNK columns (a multiple
of BLOCK_N, so only a row's last chunk has a tail). `softmax_split_state_kernel` folds each chunk
into its own state (m, l) and writes it to an (M, S) float32 buffer: O(M·S) temporaries, never
O(M·N). `softmax_split_normalize_kernel` merges a row's S states (merge_many) and normalizes its
chunk. It runs its programs in the reverse order of the first kernel, and walks each chunk in
reverse, so the data read last by the first kernel (still in L2) is re-read first. Traffic: 2 reads
(the second partly from L2) + 1 write, spread over S·M programs.

Programs are numbered on a 1-D grid, lin = block·S + s (a 2-D grid caps its y dim at 65535).
STAGES > 1 pipelines the tile loops (cp.async, see softmax_row.py); KEEP / LAST / STORE are the
cache hints of the first read, the re-read and the output (softmax_io.py).
"""
import triton
import triton.language as tl

from .online import identity, merge_many, normalize, update
from .softmax_io import LOG2E, load_tile, row_base, store_tile


@triton.jit
def _chunk(lin, S, M, N, CHUNK, BLOCK_M: tl.constexpr):
    """Program `lin`: its split s, its rows (and their mask), its columns [start, stop), in N's
    integer type (softmax_io.py: int64 exactly for rows of 2^31 columns or more). stop is formed
    without start + CHUNK, which can pass 2^31 − 1 on a row below 2^31 columns."""
    s = lin % S
    rows = (lin // S) * BLOCK_M + tl.arange(0, BLOCK_M)
    start = s.to(N.dtype) * CHUNK
    stop = start + tl.minimum(N - start, CHUNK)
    return s, rows, rows < M, start, stop


# N stays a runtime integer: Triton turns an argument equal to 1 into a constant, which has no
# .dtype for the column type below, and kernel="split" takes rows of one column (H200 tests).
@triton.jit(do_not_specialize=["N"])
def softmax_split_state_kernel(x_ptr, m_ptr, l_ptr, M, N, stride_xm, stride_xn, CHUNK, S,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               COL_CONTIG: tl.constexpr, STAGES: tl.constexpr = 1,
                               KEEP: tl.constexpr = ""):
    ACC: tl.constexpr = x_ptr.dtype.element_ty == tl.float32  # online.py: float32's accurate verbs
    s, rows, row_mask, start, stop = _chunk(tl.program_id(0), S, M, N, CHUNK, BLOCK_M)
    x_base = row_base(x_ptr, rows, stride_xm)
    offs = tl.arange(0, BLOCK_N)
    num_full = (stop - start) // BLOCK_N
    tail = start + num_full * BLOCK_N

    m, l = identity(BLOCK_M, ACC)
    for t in tl.range(0, num_full, num_stages=STAGES):
        x = load_tile(x_base, start + t * BLOCK_N + offs, stride_xn, row_mask, N, float("-inf"),
                      COL_CONTIG, False, KEEP)
        m, l, _, _ = update(m, l, x, LOG2E, ACCURATE=ACC)
    if tail < stop:  # only the row's last chunk: stop == N there, so `cols < N` masks it
        x = load_tile(x_base, tail + offs, stride_xn, row_mask, N, float("-inf"), COL_CONTIG, True,
                      KEEP)
        m, l, _, _ = update(m, l, x, LOG2E, ACCURATE=ACC)

    state = rows.to(tl.int64) * S + s
    tl.store(m_ptr + state, m, mask=row_mask)
    tl.store(l_ptr + state, l, mask=row_mask)


# N stays a runtime integer: Triton turns an argument equal to 1 into a constant, which has no
# .dtype for the column type below, and kernel="split" takes rows of one column (H200 tests).
@triton.jit(do_not_specialize=["N"])
def softmax_split_normalize_kernel(x_ptr, y_ptr, m_ptr, l_ptr, M, N, stride_xm, stride_xn,
                                   stride_ym, CHUNK, S, BLOCK_M: tl.constexpr,
                                   BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
                                   COL_CONTIG: tl.constexpr, STAGES: tl.constexpr = 1,
                                   LAST: tl.constexpr = "", STORE: tl.constexpr = "",
                                   LOG: tl.constexpr = False):
    ACC: tl.constexpr = x_ptr.dtype.element_ty == tl.float32  # online.py: float32's accurate verbs
    lin = tl.num_programs(0) - 1 - tl.program_id(0)
    s, rows, row_mask, start, stop = _chunk(lin, S, M, N, CHUNK, BLOCK_M)

    parts = tl.arange(0, BLOCK_S)
    states = rows.to(tl.int64)[:, None] * S + parts[None, :]
    in_row = row_mask[:, None] & (parts < S)[None, :]
    # Unused slots are the identity state (m = -inf, l = 0), which merge_many ignores.
    m, l = merge_many(tl.load(m_ptr + states, mask=in_row, other=float("-inf")),
                      tl.load(l_ptr + states, mask=in_row, other=0.0), LOG2E, ACC)

    x_base = row_base(x_ptr, rows, stride_xm)
    y_base = row_base(y_ptr, rows, stride_ym)
    offs = tl.arange(0, BLOCK_N)
    num_full = (stop - start) // BLOCK_N
    tail = start + num_full * BLOCK_N
    if tail < stop:
        cols = tail + offs
        x = load_tile(x_base, cols, stride_xn, row_mask, N, 0.0, COL_CONTIG, True, LAST)
        store_tile(y_base, cols, row_mask, N, normalize(x, m, l, LOG2E, ACC, LOG), True, STORE)
    for t in tl.range(0, num_full, num_stages=STAGES):
        cols = start + (num_full - 1 - t) * BLOCK_N + offs
        x = load_tile(x_base, cols, stride_xn, row_mask, N, 0.0, COL_CONTIG, False, LAST)
        store_tile(y_base, cols, row_mask, N, normalize(x, m, l, LOG2E, ACC, LOG), False, STORE)
