"""Fused softmax backward, dx = y·(dy − Σ y·dy), one program per block of rows (persistent grid).

ONE_TILE (BLOCK_N ≥ N): the row is one tile in registers, y and dy are read once and dx written
once (3·M·N elements moved, the floor). Otherwise the row is walked in BLOCK_N tiles: a first pass
accumulates y·dy element-wise in float32 (one cross-thread reduction at the end, not one per tile),
then a second pass walks the row in reverse (the tiles read last are still in L2) and writes dx; the
tail tile, read last, is written from registers.

float32 inputs reduce the dot in float64 (ACC): dx = y·(dy − dot) cancels where dy ≈ dot, and a
float32 dot's final rounding (half an ulp of |dot|) then dominates dx's error, up to ~2 ulps of
|dot|·y where torch's float32 result may land within a fraction of one (seen in the tests: 2.1e-7
against torch's 2.3e-8 on a 16-column row). So the per-thread partial sums (float32 fused
multiply-adds, one rounding per element, as before) are added up in float64, and dx is formed from
the float64 dot split into two float32 halves (_dx): no float64 value per element is held, so the
registers, and the occupancy, are those of the float32 kernel. 16-bit inputs keep float32 (their
eps dwarfs a float32 ulp).

LOG: the log-softmax backward, dx = dy − e^y·Σ dy (y the log-softmax output): the same passes with
Σ dy for the dot and _dx's LOG form. |e^y·Σ dy| is many times |dx| (Σ dy grows with the row), so
e^y's own rounding, times Σ dy, is most of both torch's error and ours: with e^y in float32 (even
correctly rounded, in the interpreter) which side's rounding happened to be smaller decided the 2×
rule, and fresh seeds failed it in 1 to 6 of 40 float32 log-gradient checks per run. float32 data
therefore take e^y and the product in float64 (one libdevice exp per element on the FP64 pipe,
rounded once into dx); 16-bit data keep float32 (their eps dwarfs it).
"""
import triton
import triton.language as tl

from .softmax_io import LOG2E, load_tile, row_base, store_tile


@triton.jit
def _dx(y, dy, dot, ACC: tl.constexpr, LOG: tl.constexpr = False):
    """dx = y·(dy − dot) from float32 tiles and ACC row dots, element-wise in float32: the dot is
    split into hi + lo (float32 each); dy − hi is exact where it cancels (Sterbenz), and one fused
    multiply-add, y·(dy − hi) − y·lo, rounds once more. No float64 value per element is held.
    LOG: dx = dy − e^y·dot (dot = Σ dy): in float64 for float32 data (see above), rounded once;
    else e^y·dot in one fused multiply-add."""
    if LOG:
        if ACC == tl.float64:
            dx = (dy.to(tl.float64) - tl.exp(y.to(tl.float64)) * dot[:, None]).to(tl.float32)
        else:
            dx = tl.math.fma(-tl.math.exp2(y * LOG2E), dot[:, None], dy)
    else:
        hi = dot.to(tl.float32)
        lo = (dot - hi.to(ACC)).to(tl.float32)
        dx = tl.math.fma(y, dy - hi[:, None], -(y * lo[:, None]))
    return dx


@triton.jit
def _dot_term(y, dy, acc, LOG: tl.constexpr):
    """acc + y·dy (one fused multiply-add), or acc + dy for LOG (its dot is Σ dy)."""
    if LOG:
        r = acc + dy
    else:
        r = tl.math.fma(y, dy, acc)
    return r


@triton.jit
def softmax_backward_kernel(y_ptr, dy_ptr, dx_ptr, M, N, stride_ym, stride_yn, stride_dym,
                            stride_dyn, stride_dxm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            Y_CONTIG: tl.constexpr, DY_CONTIG: tl.constexpr,
                            ONE_TILE: tl.constexpr, MASK_N: tl.constexpr, LOG: tl.constexpr = False):
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    offs = tl.arange(0, BLOCK_N)
    num_full = N // BLOCK_N
    tail = num_full * BLOCK_N
    ACC = tl.float64 if y_ptr.dtype.element_ty == tl.float32 else tl.float32
    for block in tl.range(pid, tl.cdiv(M, BLOCK_M), num_programs):
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        row_mask = rows < M
        y_base = row_base(y_ptr, rows, stride_ym)
        dy_base = row_base(dy_ptr, rows, stride_dym)
        dx_base = row_base(dx_ptr, rows, stride_dxm)
        if ONE_TILE:
            y = load_tile(y_base, offs, stride_yn, row_mask, N, 0.0, Y_CONTIG, MASK_N)
            dy = load_tile(dy_base, offs, stride_dyn, row_mask, N, 0.0, DY_CONTIG, MASK_N)
            if LOG:
                dot = tl.sum(dy.to(ACC), axis=1)
            else:
                dot = tl.sum((y * dy).to(ACC), axis=1)
            store_tile(dx_base, offs, row_mask, N, _dx(y, dy, dot, ACC, LOG), MASK_N)
        else:
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for t in tl.range(0, num_full):
                cols = t * BLOCK_N + offs
                y = load_tile(y_base, cols, stride_yn, row_mask, N, 0.0, Y_CONTIG, False)
                dy = load_tile(dy_base, cols, stride_dyn, row_mask, N, 0.0, DY_CONTIG, False)
                acc = _dot_term(y, dy, acc, LOG)
            if tail < N:
                cols = tail + offs
                y = load_tile(y_base, cols, stride_yn, row_mask, N, 0.0, Y_CONTIG, True)
                dy = load_tile(dy_base, cols, stride_dyn, row_mask, N, 0.0, DY_CONTIG, True)
                dot = tl.sum(_dot_term(y, dy, acc, LOG).to(ACC), axis=1)
                store_tile(dx_base, cols, row_mask, N, _dx(y, dy, dot, ACC, LOG), True)
            else:
                dot = tl.sum(acc.to(ACC), axis=1)
            for t in tl.range(0, num_full):
                cols = (num_full - 1 - t) * BLOCK_N + offs
                y = load_tile(y_base, cols, stride_yn, row_mask, N, 0.0, Y_CONTIG, False)
                dy = load_tile(dy_base, cols, stride_dyn, row_mask, N, 0.0, DY_CONTIG, False)
                store_tile(dx_base, cols, row_mask, N, _dx(y, dy, dot, ACC, LOG), False)
