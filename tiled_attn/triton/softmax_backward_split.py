"""Split-row softmax backward for few, huge rows: S programs per row, like the split forward.

`softmax_backward_dot_kernel` sums y·dy over each chunk into an (M, S) float32 buffer (O(M·S)
temporaries); `softmax_backward_split_kernel` adds a row's S partial sums and writes its chunk of
dx = y·(dy − Σ y·dy), its programs and tiles in the reverse order of the first kernel's so the data
read last is re-read first from L2. Chunking and program numbering are the split forward's.
float32 inputs keep the per-thread running sums in float64 and write a float64 buffer
(softmax_backward.py says why). LOG: the log-softmax backward (Σ dy, dx = dy − e^y·Σ dy), as softmax_backward.py.
"""
import triton
import triton.language as tl

from .softmax_backward import _dot_term, _dx
from .softmax_io import load_tile, row_base, store_tile
from .softmax_split import _chunk


@triton.jit
def softmax_backward_dot_kernel(y_ptr, dy_ptr, dot_ptr, M, N, stride_ym, stride_yn, stride_dym,
                                stride_dyn, CHUNK, S, BLOCK_M: tl.constexpr,
                                BLOCK_N: tl.constexpr, Y_CONTIG: tl.constexpr,
                                DY_CONTIG: tl.constexpr, LOG: tl.constexpr = False):
    s, rows, row_mask, start, stop = _chunk(tl.program_id(0), S, M, N, CHUNK, BLOCK_M)
    y_base = row_base(y_ptr, rows, stride_ym)
    dy_base = row_base(dy_ptr, rows, stride_dym)
    offs = tl.arange(0, BLOCK_N)
    num_full = (stop - start) // BLOCK_N
    tail = start + num_full * BLOCK_N

    # float32 data: every lane's running sum is float64 too. A chunk is thousands of tiles on the
    # huge rows this kernel exists for, and a float32 lane sum of near-equal terms (a row's flat
    # background) can round the same way at every tile. On the H100 the backward of a 1 x
    # (2^31 + 17) float32 row with a flat background missed its bound (8 float32 ulps of an
    # output's size) by 1.9x at one column (tests/test_softmax.py::
    # test_default_backend_one_row_past_2_31): an error of Σ y·dy of ~2e-6 relative, what such
    # lane sums can reach. One float64 add per element costs nothing in this memory-bound pass.
    ACC = tl.float64 if y_ptr.dtype.element_ty == tl.float32 else tl.float32
    acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
    for t in tl.range(0, num_full):
        cols = start + t * BLOCK_N + offs
        y = load_tile(y_base, cols, stride_yn, row_mask, N, 0.0, Y_CONTIG, False)
        dy = load_tile(dy_base, cols, stride_dyn, row_mask, N, 0.0, DY_CONTIG, False)
        acc = _dot_term(y.to(ACC), dy.to(ACC), acc, LOG)
    if tail < stop:  # only the row's last chunk, where stop == N
        cols = tail + offs
        y = load_tile(y_base, cols, stride_yn, row_mask, N, 0.0, Y_CONTIG, True)
        dy = load_tile(dy_base, cols, stride_dyn, row_mask, N, 0.0, DY_CONTIG, True)
        acc = _dot_term(y.to(ACC), dy.to(ACC), acc, LOG)
    # The buffer's type is the accumulation type (float64 for float32 data): the sum converts.
    tl.store(dot_ptr + rows.to(tl.int64) * S + s,
             tl.sum(acc.to(dot_ptr.dtype.element_ty), axis=1), mask=row_mask)


@triton.jit
def softmax_backward_split_kernel(y_ptr, dy_ptr, dx_ptr, dot_ptr, M, N, stride_ym, stride_yn,
                                  stride_dym, stride_dyn, stride_dxm, CHUNK, S,
                                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                  BLOCK_S: tl.constexpr, Y_CONTIG: tl.constexpr,
                                  DY_CONTIG: tl.constexpr, LOG: tl.constexpr = False):
    lin = tl.num_programs(0) - 1 - tl.program_id(0)
    s, rows, row_mask, start, stop = _chunk(lin, S, M, N, CHUNK, BLOCK_M)
    parts = tl.arange(0, BLOCK_S)
    partial = tl.load(dot_ptr + rows.to(tl.int64)[:, None] * S + parts[None, :],
                      mask=row_mask[:, None] & (parts < S)[None, :], other=0.0)
    dot = tl.sum(partial, axis=1)
    ACC = tl.float64 if y_ptr.dtype.element_ty == tl.float32 else tl.float32

    y_base = row_base(y_ptr, rows, stride_ym)
    dy_base = row_base(dy_ptr, rows, stride_dym)
    dx_base = row_base(dx_ptr, rows, stride_dxm)
    offs = tl.arange(0, BLOCK_N)
    num_full = (stop - start) // BLOCK_N
    tail = start + num_full * BLOCK_N
    if tail < stop:
        cols = tail + offs
        y = load_tile(y_base, cols, stride_yn, row_mask, N, 0.0, Y_CONTIG, True)
        dy = load_tile(dy_base, cols, stride_dyn, row_mask, N, 0.0, DY_CONTIG, True)
        store_tile(dx_base, cols, row_mask, N, _dx(y, dy, dot, ACC, LOG), True)
    for t in tl.range(0, num_full):
        cols = start + (num_full - 1 - t) * BLOCK_N + offs
        y = load_tile(y_base, cols, stride_yn, row_mask, N, 0.0, Y_CONTIG, False)
        dy = load_tile(dy_base, cols, stride_dyn, row_mask, N, 0.0, DY_CONTIG, False)
        store_tile(dx_base, cols, row_mask, N, _dx(y, dy, dot, ACC, LOG), False)
