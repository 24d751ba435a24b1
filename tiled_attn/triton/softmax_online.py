"""Online softmax for rows too long for registers: one pass folding tiles into the state (m, l), then
a normalize pass that re-reads the row.

Adds over the row kernel: any N, in BLOCK_N-column tiles. The second pass walks the row in reverse,
so the tiles it reads first are the ones the first pass read last and are still in L2; the tail
tile (read last) is normalized straight from registers. The grid is persistent and kept small
(PROGRAMS_PER_SM in the config) because L2 reuse needs the rows in flight to fit in L2: with
132 SMs × 1 program × a 512 KB fp32 row that is 66 MB against the H100's 50 MB, so most, not all,
of the re-read hits L2. Traffic: 2 reads (the second mostly from L2) + 1 write. Wins for many long
rows; few huge rows leave SMs idle, which the split kernel fixes.
With one program per SM nothing else on the SM hides a tile's load latency, so STAGES > 1 pipelines
both tile loops (cp.async into shared memory, STAGES − 1 tiles ahead: see softmax_row.py). Cache
hints (KEEP on the first pass, LAST on the re-read, STORE on the output) keep the row in L2 for the
re-read rather than the output.
"""
import triton
import triton.language as tl

from .online import identity, normalize, update
from .softmax_io import LOG2E, load_tile, row_base, store_tile


@triton.jit
def softmax_online_kernel(x_ptr, y_ptr, M, N, stride_xm, stride_xn, stride_ym,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, COL_CONTIG: tl.constexpr,
                          STAGES: tl.constexpr = 1, KEEP: tl.constexpr = "",
                          LAST: tl.constexpr = "", STORE: tl.constexpr = "", LOG: tl.constexpr = False):
    ACC: tl.constexpr = x_ptr.dtype.element_ty == tl.float32  # online.py: float32's accurate verbs
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    offs = tl.arange(0, BLOCK_N)
    num_full = N // BLOCK_N
    tail = num_full * BLOCK_N
    for block in tl.range(pid, tl.cdiv(M, BLOCK_M), num_programs):
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        row_mask = rows < M
        x_base = row_base(x_ptr, rows, stride_xm)
        y_base = row_base(y_ptr, rows, stride_ym)

        m, l = identity(BLOCK_M, ACC)
        # Full tiles unmasked along the columns (keeps the 16-byte packs), the tail masked.
        for t in tl.range(0, num_full, num_stages=STAGES):
            x = load_tile(x_base, t * BLOCK_N + offs, stride_xn, row_mask, N, float("-inf"),
                          COL_CONTIG, False, KEEP)
            m, l, _, _ = update(m, l, x, LOG2E, ACCURATE=ACC)
        if tail < N:
            cols = tail + offs
            x = load_tile(x_base, cols, stride_xn, row_mask, N, float("-inf"), COL_CONTIG, True,
                          LAST)
            m, l, _, _ = update(m, l, x, LOG2E, ACCURATE=ACC)
            # The state is final after the last tile: write it from registers, no re-read.
            store_tile(y_base, cols, row_mask, N, normalize(x, m, l, LOG2E, ACC, LOG), True, STORE)

        for t in tl.range(0, num_full, num_stages=STAGES):
            cols = (num_full - 1 - t) * BLOCK_N + offs
            x = load_tile(x_base, cols, stride_xn, row_mask, N, 0.0, COL_CONTIG, False, LAST)
            store_tile(y_base, cols, row_mask, N, normalize(x, m, l, LOG2E, ACC, LOG), False, STORE)
