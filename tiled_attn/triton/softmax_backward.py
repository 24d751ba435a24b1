"""Fused softmax backward, dx = y·(dy − Σ y·dy), one program per block of rows (persistent grid).

ONE_TILE (BLOCK_N ≥ N): the row is one tile in registers, y and dy are read once and dx written
once (3·M·N elements moved, the floor). Otherwise the row is walked in BLOCK_N tiles: a first pass
accumulates y·dy element-wise in float32 (one cross-thread reduction at the end, not one per tile),
then a second pass walks the row in reverse (the tiles read last are still in L2) and writes dx; the
tail tile, read last, is written from registers.
"""
import triton
import triton.language as tl

from .softmax_io import load_tile, row_base, store_tile


@triton.jit
def softmax_backward_kernel(y_ptr, dy_ptr, dx_ptr, M, N, stride_ym, stride_yn, stride_dym,
                            stride_dyn, stride_dxm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            Y_CONTIG: tl.constexpr, DY_CONTIG: tl.constexpr,
                            ONE_TILE: tl.constexpr, MASK_N: tl.constexpr):
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    offs = tl.arange(0, BLOCK_N)
    num_full = N // BLOCK_N
    tail = num_full * BLOCK_N
    for block in tl.range(pid, tl.cdiv(M, BLOCK_M), num_programs):
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        row_mask = rows < M
        y_base = row_base(y_ptr, rows, stride_ym)
        dy_base = row_base(dy_ptr, rows, stride_dym)
        dx_base = row_base(dx_ptr, rows, stride_dxm)
        if ONE_TILE:
            y = load_tile(y_base, offs, stride_yn, row_mask, N, 0.0, Y_CONTIG, MASK_N)
            dy = load_tile(dy_base, offs, stride_dyn, row_mask, N, 0.0, DY_CONTIG, MASK_N)
            dot = tl.sum(y * dy, axis=1)
            store_tile(dx_base, offs, row_mask, N, y * (dy - dot[:, None]), MASK_N)
        else:
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for t in tl.range(0, num_full):
                cols = t * BLOCK_N + offs
                y = load_tile(y_base, cols, stride_yn, row_mask, N, 0.0, Y_CONTIG, False)
                dy = load_tile(dy_base, cols, stride_dyn, row_mask, N, 0.0, DY_CONTIG, False)
                acc += y * dy
            if tail < N:
                cols = tail + offs
                y = load_tile(y_base, cols, stride_yn, row_mask, N, 0.0, Y_CONTIG, True)
                dy = load_tile(dy_base, cols, stride_dyn, row_mask, N, 0.0, DY_CONTIG, True)
                dot = tl.sum(acc + y * dy, axis=1)
                store_tile(dx_base, cols, row_mask, N, y * (dy - dot[:, None]), True)
            else:
                dot = tl.sum(acc, axis=1)
            for t in tl.range(0, num_full):
                cols = (num_full - 1 - t) * BLOCK_N + offs
                y = load_tile(y_base, cols, stride_yn, row_mask, N, 0.0, Y_CONTIG, False)
                dy = load_tile(dy_base, cols, stride_dyn, row_mask, N, 0.0, DY_CONTIG, False)
                store_tile(dx_base, cols, row_mask, N, y * (dy - dot[:, None]), False)
