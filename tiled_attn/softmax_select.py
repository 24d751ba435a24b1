"""backend=None's backend and kernel for a softmax on a CUDA device, chosen from measurement.

`select(m, n, dtype, contiguous, arch, cuda_ok, log)` reads configs.SOFTMAX_SELECT: rows over the row
length N (and, where it paid, the row count M) per (arch, dtype, layout), fitted by
benchmarks/sweep_softmax_random.py on eager timings of every kernel of every backend over a random
set of shapes, and checked on a held-out set (issue 16). It is a pure function of its arguments and
that table: no device reads, so tiled_attn/softmax.py calls it once, when it makes a plan, never per
call. With no row for the key (an unmeasured arch, dtype or layout, an N past the sweep's longest
row) it returns the choice made before the table existed: DEFAULT_BACKEND's backend with its own
kernel rule (kernel None).

A row never makes a call fail that the old choice would have run: the CUDA backend needs its
extension (`cuda_ok`) and has no log_softmax kernels, so without them the "triton" pool's rows
apply; a kernel that holds the row on chip is returned only for rows it takes whatever the layout
and alignment (`max_n`), else its backend's own rule picks.
"""
from __future__ import annotations

import torch

from . import configs

__all__ = ["select", "for_tensor", "today", "max_n", "layout_key"]

_INF = float("inf")

# The longest rows of the CUDA kernels that cache a row on chip, for any layout and alignment
# (csrc/softmax/): a plan is keyed by shape and strides, not by the data pointer, so a plan made on
# a 16-byte-aligned tensor may run on a misaligned one of the same shape, which takes the scalar
# path. block_row_reg: kMaxThreads (1024) × kBlockRowRegMaxColsPerThreadScalar (8) = 8192 (32768
# when packable). block_row_smem: the opt-in shared memory less its reserve, (227 KB − 1 KB) / 16
# · 16 = 231424 bytes a CTA, times kMaxCluster = 8 CTAs on sm_90; other archs are not listed (the
# extension asks the device), so there it is never picked. The other rungs take any length.
_CUDA_BLOCK_ROW_REG_MAX_N = 1024 * 8
_CUDA_FLAT_ROWS_MAX_N = 2048  # flat_rows: one group of <= 32 lanes, 64 values a lane (kFlatRowsMaxCols)
_CUDA_BLOCK_ROW_SMEM_BYTES = {"sm90": 231424 * 8}


def _dtype_key(dtype) -> str:
    return dtype if isinstance(dtype, str) else configs.dtype_key(dtype)


def _esize(dt: str) -> int:
    return 4 if dt == "fp32" else 2


def layout_key(contiguous: bool) -> str:
    return "contig" if contiguous else "strided"


def today(cuda_ok: bool, log: bool = False) -> tuple[str, None]:
    """The choice before SOFTMAX_SELECT: DEFAULT_BACKEND's backend for CUDA (Triton where the CUDA
    extension cannot run or for log_softmax), with that backend's own kernel rule."""
    backend = configs.DEFAULT_BACKEND[("softmax", "cuda")]
    if backend == "cuda" and (log or not cuda_ok):
        backend = "triton"
    return backend, None


def max_n(backend: str, kernel: str, arch: str, dtype) -> float:
    """The longest row `kernel` of `backend` takes for every layout and alignment (inf: any)."""
    dt, arch = _dtype_key(dtype), configs.base_arch(arch)
    if backend == "triton":
        if kernel != "row":
            return _INF
        # configs.triton_softmax_config: the first (arch, dtype) table whose largest class covers
        # N answers, so "row" takes any N up to the largest class among them.
        bounds = [k[3] for k in configs.TRITON_SOFTMAX
                  if k[0] == "row" and k[1] in (arch, "any") and k[2] in (dt, "any")]
        return max(bounds, default=0)
    if backend == "cuda":
        if kernel == "block_row_reg":
            return _CUDA_BLOCK_ROW_REG_MAX_N
        if kernel == "flat_rows":
            return _CUDA_FLAT_ROWS_MAX_N
        if kernel == "block_row_smem":
            return _CUDA_BLOCK_ROW_SMEM_BYTES.get(arch, 0) // _esize(dt)
        return _INF
    return 0


def _not_for_flat_rows(kernel: str | None, n: int, dt: str, packed: bool) -> bool:
    """flat_rows exists for rows whose starts leave the 16-byte grid (N·size not a multiple of 16),
    which the row-cached rungs read one element at a time; on aligned rows they move 16-byte packs
    themselves, and its staging through shared memory only costs (H200: 262144x32 fp32, aligned,
    51% of copy against Triton "row"'s 68%). It reads a block's rows as one span only when they lie
    back to back (`packed`); rows with gaps between them (a slice of wider rows) it copies one
    element at a time. The sweep times neither (its random N are rarely aligned, its tensors
    contiguous), so such a row skips a flat_rows row of the table to the next one."""
    return kernel == "flat_rows" and (not packed or n * _esize(dt) % 16 == 0)


def _usable(backend: str, cuda_ok: bool, log: bool) -> bool:
    return backend == "triton" or (backend == "cuda" and cuda_ok and not log)


def select(m: int, n: int, dtype, contiguous: bool, arch: str, cuda_ok: bool,
           log: bool = False, packed: bool = True) -> tuple[str, str | None]:
    """(backend, kernel or None) for a softmax (log_softmax with `log`) over M rows of N columns of
    `dtype` on a device of `arch` (configs.model_arch, e.g. "sm90:h200", or configs.arch), rows
    with unit column stride or not (`contiguous`), the CUDA extension usable or not (`cuda_ok`),
    rows back to back or not (`packed`: row stride N as well).
    Deterministic; reads only configs.SOFTMAX_SELECT and the kernel limits above."""
    dt = _dtype_key(dtype)
    if m * n < configs.SOFTMAX_SELECT_MIN_ELEMS:
        return today(cuda_ok, log)  # smaller than any measured shape (configs.py)
    pools = ("all", "triton") if cuda_ok and not log else ("triton",)
    archs = tuple(dict.fromkeys((arch, configs.base_arch(arch))))  # the model's rows, then its arch's
    for pool in pools:
        keys = [(a, dt, layout_key(contiguous), pool) for a in archs]
        rows = next((r for r in map(configs.SOFTMAX_SELECT.get, keys) if r), None)
        if not rows:
            continue
        for n_max, m_min, backend, kernel in rows:
            if n <= n_max and m >= m_min:
                if _not_for_flat_rows(kernel, n, dt, packed):
                    continue
                if not _usable(backend, cuda_ok, log):
                    break  # a hand-edited row: the pool's promise broken, keep today's choice
                if kernel is not None and n > max_n(backend, kernel, arch, dt):
                    return backend, None  # past the kernel's limit: its backend's own rule
                return backend, kernel
        return today(cuda_ok, log)  # N past the measured rows (or a broken row)
    return today(cuda_ok, log)


def for_tensor(x: torch.Tensor, dim: int, log: bool = False,
               contiguous: bool | None = None) -> tuple[str, str | None]:
    """select() for ta.softmax(x, dim) with backend=None on a CUDA device (called when a plan is
    made). `contiguous`: whether the kernel reads rows with unit column stride (default: x's stride
    along dim is 1; the dispatcher passes True where it copies the rows into order first, and the
    copy's rows are back to back)."""
    n = x.shape[dim]
    m = x.numel() // n if n else 0
    packed = contiguous is True or x.movedim(dim, -1).is_contiguous()
    if contiguous is None:
        contiguous = x.stride(dim) == 1 or n <= 1
    return _select_static(m, n, x.dtype, contiguous, x.device, log, packed)


@torch._dynamo.assume_constant_result
def _select_static(m: int, n: int, dtype: torch.dtype, contiguous: bool, device: torch.device,
                   log: bool, packed: bool = True) -> tuple[str, str | None]:
    """select() with the device's model and arch and whether the CUDA extension is available. Those
    read device properties and the extension's build files, which torch.compile cannot trace: a call
    it traces (static shapes only: tiled_attn/softmax.py _pick) runs this once, eagerly, and keeps
    the result as a constant of the graph, so compiled and eager calls pick the same kernel."""
    from . import cuda
    return select(m, n, dtype, contiguous, configs.model_arch(device), cuda.is_available(), log, packed)
