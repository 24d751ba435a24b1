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
"""
import triton
import triton.language as tl

from .online import identity, normalize, update
from .softmax_io import LOG2E, load_tile, row_base, store_tile


@triton.jit
def softmax_row_kernel(x_ptr, y_ptr, M, N, stride_xm, stride_xn, stride_ym,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, COL_CONTIG: tl.constexpr,
                       MASK_N: tl.constexpr, STAGES: tl.constexpr = 1, LAST: tl.constexpr = "",
                       STORE: tl.constexpr = "", LOG: tl.constexpr = False, VEC: tl.constexpr = 1):
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
        row_mask = rows < M
        # Padding columns read -inf: they add exp2(-inf) = 0 to l and never raise the max.
        x = load_tile(row_base(x_ptr, rows, stride_xm), cols, stride_xn, row_mask, N, float("-inf"),
                      COL_CONTIG, MASK_N, LAST)
        m, l = identity(BLOCK_M)  # one tile, no running sum: float32 l even for float32 (online.py)
        m, l, _, _ = update(m, l, x, LOG2E, ACCURATE=ACC)
        store_tile(row_base(y_ptr, rows, stride_ym), cols, row_mask, N, normalize(x, m, l, LOG2E, ACC, LOG),
                   MASK_N, STORE)
