"""CUDA softmax: pick the kernel and its launch config (configs.CUDA_SOFTMAX), launch csrc/softmax.

The arguments were validated by tiled_attn.softmax (_checks); plan_forward / plan_backward look the
config up, load the extension and return the call as a function (cached per signature by
tiled_attn/softmax.py), which calls the extension with raw tensors and the current stream. x2d may
have any strides (a column stride != 1 takes the kernels' scalar path: correct, slower, never a
hidden copy); out2d is row-major. A row too long for an on-chip kernel (block_row_reg's registers,
block_row_smem's shared memory, flat_rows' 2048 columns: the extension's softmax_max_cols, which
depends on dtype, layout and device) raises ValueError here, in Python, before the extension is asked to launch, when that
kernel was pinned (DESIGN §5); kernel=None hands such rows to split_row. The extension checks the
same limit again and returns that error too (raised by _build.call, through which every call into
the extension goes), but no valid call reaches that check.
"""
from __future__ import annotations

import functools
import math

import torch

from .. import configs
from .._plan import current_stream as _stream
from . import _build

# The ladder, slowest rung first (csrc/softmax/<name>.cu; csrc/bindings.cpp binds the same names).
SOFTMAX_KERNELS = ("naive", "online_thread", "block_smem_tree", "block_shuffle", "warp_row",
                   "block_row_reg", "block_row_smem", "tile2d", "split_row", "flat_rows")
# The rungs that hold a whole row on chip and so have a longest row (csrc/bindings.cpp max_cols;
# the extension answers -1, "any", for the others, which tests/test_cuda_softmax.py checks). Only
# these cost the extra call into the extension per softmax.
ON_CHIP_KERNELS = ("block_row_reg", "block_row_smem", "flat_rows")


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _chunk(cfg: dict, m: int, n: int, device: torch.device) -> int:
    """Columns per block for the split kernels: at most cfg['chunk'], but cut smaller (not below
    cfg['min_chunk']) until m rows give blocks_per_sm × SMs blocks, so a few long rows still fill
    the GPU."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    want = math.ceil(cfg["blocks_per_sm"] * _sm_count(index) / max(m, 1))
    splits = max(math.ceil(n / cfg["chunk"]), min(want, max(1, n // cfg["min_chunk"])))
    return math.ceil(n / splits)


def _launch_args(kernel: str, cfg: dict, m: int, n: int, device: torch.device) -> tuple:
    chunk = _chunk(cfg, m, n, device) if "chunk" in cfg else 0
    return cfg["threads"], cfg.get("cluster", 1), cfg.get("cta_bytes", 0), chunk


def plan(x2d: torch.Tensor, out2d: torch.Tensor, kernel: str | None, ext=None) -> tuple[str, tuple]:
    """(kernel name, launch args (threads, cluster, cta_bytes, chunk)) for this call. With the
    extension `ext`, a row longer than the kernel's on-chip limit goes to split_row (kernel=None) or
    raises ValueError (a pinned kernel)."""
    m, n = x2d.shape
    arch, dtype = configs.arch(x2d.device), configs.dtype_key(x2d.dtype)
    pinned = kernel is not None
    if not pinned:
        rule = configs.cuda_softmax_config("default", arch, dtype, n)
        kernel = rule["kernel"]
        if m < rule.get("few_rows", 0):
            kernel = rule["few_rows_kernel"]
    cfg = configs.cuda_softmax_config(kernel, arch, dtype, n)
    args = _launch_args(kernel, cfg, m, n, x2d.device)
    on_chip = ext is not None and kernel in ON_CHIP_KERNELS
    limit = _build.call(ext.softmax_max_cols, kernel, x2d, out2d, *args) if on_chip else -1
    if 0 <= limit < n:
        if pinned:
            raise ValueError(f"kernel={kernel!r} takes rows of at most {limit} columns for this dtype "
                             f"({x2d.dtype}) and layout (strides {tuple(x2d.stride())}) on this device, "
                             f"got {n} (kernel='split_row' or kernel=None take any length)")
        kernel = "split_row"  # e.g. a strided row past block_row_reg's scalar register cache
        cfg = configs.cuda_softmax_config(kernel, arch, dtype, n)
        args = _launch_args(kernel, cfg, m, n, x2d.device)
    return kernel, args


def _as_2d(size, stride):
    """A function giving the (M, N) view of a tensor whose data is laid out as the plan saw it (the
    extension reads sizes and strides off the tensor); the tensor itself where it already is one."""
    def view(t: torch.Tensor) -> torch.Tensor:
        return t if t.shape == size and t.stride() == stride else t.as_strided(size, stride)
    return view


def plan_forward(x2d: torch.Tensor, out2d: torch.Tensor, kernel: str | None = None):
    """run(x, out) for out2d[i] = softmax(x2d[i]) with the named kernel (None: the table's choice),
    for tensors laid out like these (tiled_attn/softmax.py caches it per signature). Loads the
    extension and checks a pinned kernel's row limit here, once."""
    ext = _build.load(x2d.device)
    kernel, args = plan(x2d, out2d, kernel, ext)
    fwd, call, index = ext.softmax_fwd, _build.call, x2d.device.index
    x_view, out_view = _as_2d(x2d.shape, x2d.stride()), _as_2d(out2d.shape, out2d.stride())

    def run(x, out):
        call(fwd, kernel, x_view(x), out_view(out), *args, _stream(index))

    if kernel != "split_row":  # its workspace keeps it on this Python path
        # what tiled_attn/softmax.py registers for the C++ launch (csrc/bindings.cpp fast_register_softmax)
        run.fast_spec = lambda: {"softmax_kernel": kernel, "launch": args}
    return run


def plan_backward(y2d: torch.Tensor, dy2d: torch.Tensor, dx2d: torch.Tensor):
    """run(y, dy, dx) for dx2d = y2d · (dy2d − Σ_row dy2d · y2d) (see plan_forward)."""
    m, n = y2d.shape
    cfg = configs.cuda_softmax_config("backward", configs.arch(y2d.device), configs.dtype_key(y2d.dtype), n)
    ext = _build.load(y2d.device)
    bwd, call, index = ext.softmax_bwd, _build.call, y2d.device.index
    threads, chunk = cfg["threads"], _chunk(cfg, m, n, y2d.device)
    views = [_as_2d(t.shape, t.stride()) for t in (y2d, dy2d, dx2d)]

    def run(y, dy, dx):
        call(bwd, views[0](y), views[1](dy), views[2](dx), threads, chunk, _stream(index))
    return run


def softmax_forward(x2d: torch.Tensor, out2d: torch.Tensor, kernel: str | None = None) -> None:
    """out2d[i] = softmax(x2d[i]) for each row (planned for this one call)."""
    if x2d.numel():
        plan_forward(x2d, out2d, kernel)(x2d, out2d)


def softmax_backward(y2d: torch.Tensor, dy2d: torch.Tensor, dx2d: torch.Tensor) -> None:
    """dx2d = y2d · (dy2d − Σ_row dy2d · y2d); y2d and dy2d with any strides, dx2d row-major."""
    if y2d.numel():
        plan_backward(y2d, dy2d, dx2d)(y2d, dy2d, dx2d)
