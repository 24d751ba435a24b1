"""Row softmax on chip: each row is one tile in registers, read once and written once (2·M·N bytes
moved, the floor; the unfused max → exp → sum → divide chain moves ~5·M·N).

Adds over a one-row-per-program kernel (Triton tutorial 02): BLOCK_M rows per tile, so a short row
(N = 32 is a 128-byte line in fp32) still loads kilobytes per instruction stream, and a persistent
grid: the wrapper sizes it from the compiled kernel's occupancy (WAVES in the config: 1 = as many
programs as fit on the GPU at once, each walking row blocks with a stride of the grid, so launch and
tail costs are paid once; 0 = one program per row block, the hardware scheduling them).
STAGES > 1 software-pipelines the row-block loop: Triton 3.6 copies the next STAGES − 1 tiles into
shared memory with cp.async while this one is reduced (only an explicit tl.range(num_stages=...)
does this for loads that feed no dot; the launch option alone does not), so a program keeps loads
in flight through its own reductions instead of relying on other programs on the SM.
Wins while a row fits in registers (up to 32K columns: see configs.py).
LOG writes log-softmax instead (online.normalize), in this kernel and every other forward kernel.
VEC > 1 tells the compiler what the wrapper checked: N and both row strides are multiples of VEC
(softmax_io.vec_width). Triton specializes an integer argument only on divisibility by 16, so a row
of 88 fp32 columns (352 bytes, 16-byte aligned) read as scalar 4-byte loads: with VEC = 4 the column
mask holds over groups of 4 and the loads pack into 16 bytes again.
WIN > 0 (16 bytes in elements) reads rows whose starts leave the 16-byte grid (N·size not a multiple
of 16: most lengths), which the plain path reads one element at a time, as 16-byte packs. The rows
of a packed tensor (row stride N, in and out) lie back to back, so row r is the span [r·N, r·N + N)
of one flat array: the kernel loads the window that starts at r·N rounded down to a multiple of WIN,
whose packs are aligned, and masks the other rows' elements out with a `where` after the load (a
load mask that changed inside a pack would break it into single elements). It stores the packs that
lie wholly inside the row as packs, and the row's two partial packs, its first and last, from a
second, 2·WIN-wide load issued beside the first. The window's loads stop at the last pack boundary
inside the tensor (flat index < M·N rounded down to WIN), except in the row block holding the last
row, whose tail can lie past it: that block masks its loads at M·N exactly (single elements).
Measured on the H100 (benchmarks/probe_softmax_window.py), the packs pay on short rows and on the
longest ones and lose on mid-length rows, so the wrapper sets WIN only where
configs.TRITON_SOFTMAX_WINDOW says it won. The likely cause of the losses (not profiled): the window
build takes twice the registers (bf16, 4096 columns: 80 against 40 on sm_90a), so half as many
programs fit on an SM.
KEEP_P (default on) writes the one tile from update's own exponentials (online.divide_by_sum)
instead of taking them again from x: the same values, measured neutral on the H100, fewer registers.
"""
import triton
import triton.language as tl

from .online import divide_by_sum, identity, normalize, update
from .softmax_io import LOG2E, load_tile, row_base, store_masked, store_tile


@triton.jit
def _finalize(x, m, l, p, ACC: tl.constexpr, LOG: tl.constexpr, KEEP_P: tl.constexpr):
    """The one tile's output: update's p over l (KEEP_P; one exponential per element), else
    normalize from x (a second exponential: the A/B baseline of benchmarks/probe_softmax_window.py).
    Log-softmax, (x − m) − ln l, takes no exponential."""
    if KEEP_P and not LOG:
        y = divide_by_sum(p, l, ACC)
    else:
        y = normalize(x, m, l, LOG2E, ACC, LOG)
    return y


@triton.jit
def _plain_rows(x_ptr, y_ptr, rows, M, N, stride_xm, stride_xn, stride_ym, cols,
                BLOCK_M: tl.constexpr, COL_CONTIG: tl.constexpr, MASK_N: tl.constexpr,
                LAST: tl.constexpr, STORE: tl.constexpr, LOG: tl.constexpr, ACC: tl.constexpr,
                KEEP_P: tl.constexpr):
    row_mask = rows < M
    # Padding columns read -inf: they add exp2(-inf) = 0 to l and never raise the max.
    x = load_tile(row_base(x_ptr, rows, stride_xm), cols, stride_xn, row_mask, N, float("-inf"),
                  COL_CONTIG, MASK_N, LAST)
    m, l = identity(BLOCK_M)  # one tile, no running sum: float32 l even for float32 (online.py)
    m, l, p, _ = update(m, l, x, LOG2E, ACCURATE=ACC)
    y = _finalize(x, m, l, p, ACC, LOG, KEEP_P)
    store_tile(row_base(y_ptr, rows, stride_ym), cols, row_mask, N, y, MASK_N, STORE)


@triton.jit
def _window_rows(x_ptr, y_ptr, rows, M, N, cols, BLOCK_M: tl.constexpr, WIN: tl.constexpr,
                 EXACT: tl.constexpr, LAST: tl.constexpr, STORE: tl.constexpr, LOG: tl.constexpr,
                 ACC: tl.constexpr, KEEP_P: tl.constexpr):
    """Rows of a packed tensor through WIN-aligned windows. EXACT: the row block holding the last
    row, whose window may pass the last pack boundary inside the tensor: its loads are masked at the
    tensor's end element by element (no packs), its stores still go in packs."""
    row_ok = (rows < M)[:, None]
    start = rows.to(tl.int64) * N  # flat index of each row's first element
    win = (start // WIN) * WIN  # a multiple of WIN: Triton sees it and packs the loads
    shift = (start - win).to(tl.int32)  # the row's first column inside its window, < WIN
    flat = win[:, None] + cols[None, :]
    if EXACT:
        end = M.to(tl.int64) * N
    else:
        end = (M.to(tl.int64) * N // WIN) * WIN  # the last pack boundary inside the tensor
    x = tl.load(x_ptr + flat, mask=flat < end, eviction_policy=LAST)
    # The partial packs, loaded now so their latency overlaps the row's (after the stores below,
    # which may alias x for all the compiler knows, they would wait for them): window columns
    # [0, WIN) and the WIN from the pack of the row's last element.
    e = tl.arange(0, 2 * WIN)
    last = ((shift + N - 1) // WIN) * WIN
    edge = tl.where(e[None, :] < WIN, e[None, :], last[:, None] + e[None, :] - WIN)
    in_edge = row_ok & (edge >= shift[:, None]) & (edge < shift[:, None] + N)
    xe = tl.load(x_ptr + win[:, None] + edge, mask=in_edge, other=float("-inf")).to(tl.float32)

    in_row = (cols[None, :] >= shift[:, None]) & (cols[None, :] < shift[:, None] + N)
    x = tl.where(in_row, x.to(tl.float32), float("-inf"))
    m, l = identity(BLOCK_M)
    m, l, p, _ = update(m, l, x, LOG2E, ACCURATE=ACC)
    # A pack is stored whole where all of it is this row's: the mask is constant over each pack.
    pack = (cols // WIN) * WIN
    whole = row_ok & (pack[None, :] >= shift[:, None]) & (pack[None, :] + WIN <= shift[:, None] + N)
    store_masked(y_ptr + flat, _finalize(x, m, l, p, ACC, LOG, KEEP_P), whole, STORE)
    store_masked(y_ptr + win[:, None] + edge, normalize(xe, m, l, LOG2E, ACC, LOG), in_edge, STORE)


@triton.jit
def softmax_row_kernel(x_ptr, y_ptr, M, N, stride_xm, stride_xn, stride_ym,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, COL_CONTIG: tl.constexpr,
                       MASK_N: tl.constexpr, STAGES: tl.constexpr = 1, LAST: tl.constexpr = "",
                       STORE: tl.constexpr = "", LOG: tl.constexpr = False, VEC: tl.constexpr = 1,
                       WIN: tl.constexpr = 0, KEEP_P: tl.constexpr = True):
    ACC: tl.constexpr = x_ptr.dtype.element_ty == tl.float32  # online.py: float32's accurate verbs
    if VEC > 1:  # the same values, now of known divisibility (a multiply by VEC) for the packing
        N = (N // VEC) * VEC
        stride_xm = (stride_xm // VEC) * VEC
        stride_ym = (stride_ym // VEC) * VEC
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    for block in tl.range(pid, tl.cdiv(M, BLOCK_M), num_programs, num_stages=STAGES):
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        if WIN > 0:
            if (block + 1) * BLOCK_M < M:  # every row of the block has a row after it
                _window_rows(x_ptr, y_ptr, rows, M, N, cols, BLOCK_M, WIN, False, LAST, STORE, LOG,
                             ACC, KEEP_P)
            else:
                _window_rows(x_ptr, y_ptr, rows, M, N, cols, BLOCK_M, WIN, True, LAST, STORE, LOG,
                             ACC, KEEP_P)
        else:
            _plain_rows(x_ptr, y_ptr, rows, M, N, stride_xm, stride_xn, stride_ym, cols, BLOCK_M,
                        COL_CONTIG, MASK_N, LAST, STORE, LOG, ACC, KEEP_P)
