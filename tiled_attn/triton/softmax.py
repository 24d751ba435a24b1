"""The Triton softmax backend: validate the kernel choice, look up its config, launch.

The dispatcher (tiled_attn/softmax.py) hands over an (M, N) view with any strides and a row-major
(M, N) output; it has already validated dtype/device and never passes an empty tensor. Kernels:
  "row"    the row is one tile in registers: one read, one write (N up to 32768).
  "online" any N: one pass folding tiles into the online state, a reverse pass normalizing.
  "split"  few huge rows: S programs per row, partial states merged through an (M, S) buffer
           (two kernels, x read twice; or, where TRITON_SOFTMAX_DEFAULT enables split_single_pass
           and a row fits in S co-resident programs' registers, one cooperative kernel that reads
           x once: softmax_split_sync.py).
kernel=None picks by TRITON_SOFTMAX_DEFAULT (configs.py): "row" while the row fits on chip, else
"split" when there are too few rows to fill the SMs, else "online". The backward picks the same way
among its row / looped / split variants.
"""
from __future__ import annotations

import contextlib
import functools

import torch
import triton

from .. import configs
from .softmax_backward import softmax_backward_kernel
from .softmax_backward_split import softmax_backward_dot_kernel, softmax_backward_split_kernel
from .softmax_online import softmax_online_kernel
from .softmax_row import softmax_row_kernel
from .softmax_split import softmax_split_normalize_kernel, softmax_split_state_kernel
from .softmax_split_sync import softmax_split_sync_kernel

__all__ = ["SOFTMAX_KERNELS", "softmax_forward", "softmax_backward"]

SOFTMAX_KERNELS = ("row", "online", "split")
# Column indices are int32 inside a row (row bases are int64); a chunk end (start + CHUNK < 2·N)
# must not overflow either.
_MAX_N = 2**30


# ------------------------------------------------------------------------------------------------
# device facts
# ------------------------------------------------------------------------------------------------
def _device_guard(device: torch.device):
    # Triton launches on the current device: make it x's.
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _sm_count(device: torch.device, arch: str) -> int:
    if device.type != "cuda":
        # The interpreter runs programs one after another: a pretend SM count just keeps grids small.
        return configs.triton_softmax_default(arch, "any")["sm_count"]
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


_OCCUPANCY: dict = {}


def _programs_per_sm(fn, args: tuple, meta: dict, device: torch.device) -> int:
    """How many programs of this compiled kernel fit on one SM at once (Triton tutorial 02).

    Compiles the kernel for these arguments (fn.warmup: the launch that follows reuses it) and
    divides the SM's registers, shared memory and thread slots by what one program takes. Cached per
    (kernel, meta-parameters, dtypes, device); other specializations of the same kernel (another
    alignment of the strides) differ by a few registers at most.
    """
    if device.type != "cuda":
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (fn, tuple(sorted(meta.items())), tuple(getattr(a, "dtype", None) for a in args), index)
    if key not in _OCCUPANCY:
        compiled = fn.warmup(*args, grid=(1,), **meta)
        compiled._init_handles()  # loads the binary: n_regs is known only after this
        props = torch.cuda.get_device_properties(index)
        warp = props.warp_size
        num_warps = meta["num_warps"]
        # Registers are allocated per warp in units of 256.
        regs_per_warp = -(-compiled.n_regs * warp // 256) * 256
        regs_per_sm = getattr(props, "regs_per_multiprocessor", 65536)
        fits = [regs_per_sm // max(regs_per_warp * num_warps, 1),
                props.max_threads_per_multi_processor // (num_warps * warp), 32]
        # The driver reserves 1 KB of shared memory per resident program (sm80+).
        fits.append(props.shared_memory_per_multiprocessor // (compiled.metadata.shared + 1024))
        _OCCUPANCY[key] = max(1, min(fits))
    return _OCCUPANCY[key]


# ------------------------------------------------------------------------------------------------
# kernel choice and configs
# ------------------------------------------------------------------------------------------------
def _config(kernel: str, n: int, arch: str, dtype: torch.dtype, contiguous: bool = True) -> dict:
    """The config row; strided columns take BLOCK_N_STRIDED where the row has one (every element
    is then its own load with a 64-bit address, so a contiguous-size tile would spill)."""
    try:
        cfg = configs.triton_softmax_config(kernel, arch, configs.dtype_key(dtype), n)
        if not contiguous and "BLOCK_N_STRIDED" in cfg:
            cfg = {**cfg, "BLOCK_N": cfg["BLOCK_N_STRIDED"]}
        return cfg
    except KeyError as e:
        name = kernel.removeprefix("backward_")
        raise ValueError(f"kernel={name!r} cannot take rows of {n} columns on {arch}: {e.args[0]}; "
                         f"use kernel='online' or 'split' (or None to choose)") from None


def _choose(m: int, n: int, arch: str, dtype: torch.dtype, device: torch.device,
            row_limit: str) -> str:
    rule = configs.triton_softmax_default(arch, configs.dtype_key(dtype))
    if n <= rule[row_limit]:
        return "row"
    if m < rule["split_rows_per_sm"] * _sm_count(device, arch):
        return "split"
    return "online"


def _check_sizes(what: str, t: torch.Tensor) -> None:
    if t.dim() != 2:
        raise ValueError(f"{what} must be an (M, N) matrix, got shape {tuple(t.shape)}")
    if t.shape[1] > _MAX_N:
        raise ValueError(f"{what} has rows of {t.shape[1]} columns; the Triton softmax takes at most "
                         f"{_MAX_N} (2^30) columns per row (backend='torch' takes any)")


def _check_out(what: str, out: torch.Tensor, like: torch.Tensor) -> None:
    if out.shape != like.shape or (out.stride(1) != 1 and out.shape[1] > 1):
        raise ValueError(f"{what} must be a row-major {tuple(like.shape)} matrix, got shape "
                         f"{tuple(out.shape)} with strides {out.stride()}")


def _col_contig(t: torch.Tensor) -> bool:
    # Unit column stride (or a single column): the kernels then keep int32 column offsets, and
    # Triton, seeing stride 1, packs the loads into 16-byte vectors.
    return t.stride(1) == 1 or t.shape[1] == 1


def _split_plan(m: int, n: int, cfg: dict, device: torch.device, arch: str):
    """(S, CHUNK): S chunks per row of CHUNK columns (a multiple of BLOCK_N) each."""
    block_n = cfg["BLOCK_N"]
    row_blocks = triton.cdiv(m, cfg["BLOCK_M"])
    tiles = triton.cdiv(n, block_n)
    target = _sm_count(device, arch) * cfg["PROGRAMS_PER_SM"]
    splits = max(1, min(triton.cdiv(target, row_blocks), tiles // cfg["MIN_TILES"]))
    chunk = triton.cdiv(tiles, splits) * block_n
    return triton.cdiv(n, chunk), chunk


def _launch_options(cfg: dict) -> dict:
    return dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


# ------------------------------------------------------------------------------------------------
# forward
# ------------------------------------------------------------------------------------------------
def softmax_forward(x: torch.Tensor, out: torch.Tensor, kernel: str | None) -> None:
    """out[i, :] = softmax(x[i, :]) for an (M, N) x of any strides into a row-major (M, N) out."""
    if kernel is not None and kernel not in SOFTMAX_KERNELS:
        raise ValueError(f"kernel must be None or one of {list(SOFTMAX_KERNELS)} for backend='triton', "
                         f"got {kernel!r}")
    _check_sizes("x", x)
    _check_out("out", out, x)
    m, n = x.shape
    device = x.device
    arch = configs.arch(device)
    kernel = kernel or _choose(m, n, arch, x.dtype, device, "row_max_n")
    cfg = _config(kernel, n, arch, x.dtype, _col_contig(x))
    with _device_guard(device):
        if kernel == "row":
            _forward_row(x, out, cfg, device, arch)
        elif kernel == "online":
            _forward_online(x, out, cfg, device, arch)
        else:
            _forward_split(x, out, cfg, device, arch)


def _forward_row(x, out, cfg, device, arch):
    m, n = x.shape
    block_n = triton.next_power_of_2(n)
    meta = dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=block_n, COL_CONTIG=_col_contig(x),
                MASK_N=block_n != n, **_launch_options(cfg))
    args = (x, out, m, n, x.stride(0), x.stride(1), out.stride(0))
    blocks = triton.cdiv(m, cfg["BLOCK_M"])
    per_sm = _programs_per_sm(softmax_row_kernel, args, meta, device)
    grid = (min(blocks, per_sm * _sm_count(device, arch)),)
    softmax_row_kernel[grid](*args, **meta)


def _forward_online(x, out, cfg, device, arch):
    m, n = x.shape
    blocks = triton.cdiv(m, cfg["BLOCK_M"])
    grid = (min(blocks, cfg["PROGRAMS_PER_SM"] * _sm_count(device, arch)),)
    softmax_online_kernel[grid](x, out, m, n, x.stride(0), x.stride(1), out.stride(0),
                                BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
                                COL_CONTIG=_col_contig(x), **_launch_options(cfg))


def _forward_split(x, out, cfg, device, arch):
    m, n = x.shape
    if configs.triton_softmax_default(arch, configs.dtype_key(x.dtype)).get("split_single_pass"):
        if _forward_split_sync(x, out, device, arch):
            return
    splits, chunk = _split_plan(m, n, cfg, device, arch)
    grid = (splits * triton.cdiv(m, cfg["BLOCK_M"]),)
    # Unwritten state slots would be read by the merge: every (row, split) program writes its own.
    m_parts = torch.empty((m, splits), dtype=torch.float32, device=device)
    l_parts = torch.empty((m, splits), dtype=torch.float32, device=device)
    common = dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], COL_CONTIG=_col_contig(x),
                  **_launch_options(cfg))
    softmax_split_state_kernel[grid](x, m_parts, l_parts, m, n, x.stride(0), x.stride(1), chunk,
                                     splits, **common)
    softmax_split_normalize_kernel[grid](x, out, m_parts, l_parts, m, n, x.stride(0), x.stride(1),
                                         out.stride(0), chunk, splits,
                                         BLOCK_S=triton.next_power_of_2(splits), **common)


_COOPERATIVE_TOO_LARGE: set = set()  # (meta, device) whose cooperative launch was refused


def _forward_split_sync(x, out, device, arch) -> bool:
    """The single-pass split, if this row fits in co-resident programs; False to fall back."""
    m, n = x.shape
    cfg = _config("split_sync", n, arch, x.dtype, _col_contig(x))
    splits = triton.cdiv(n, cfg["BLOCK_N"])
    if splits > 1 and device.type != "cuda":
        return False  # the interpreter runs programs in turn: a wait for a later one never ends
    meta = dict(BLOCK_N=cfg["BLOCK_N"], BLOCK_S=triton.next_power_of_2(splits),
                COL_CONTIG=_col_contig(x), **_launch_options(cfg))
    if device.type == "cuda":
        meta["launch_cooperative_grid"] = True
    key = (tuple(sorted(meta.items())), x.dtype, device)
    if key in _COOPERATIVE_TOO_LARGE:
        return False
    m_parts = torch.empty((m, splits), dtype=torch.float32, device=device)
    l_parts = torch.empty((m, splits), dtype=torch.float32, device=device)
    counts = torch.zeros((m,), dtype=torch.int32, device=device)
    args = (x, out, m_parts, l_parts, counts, m, n, x.stride(0), x.stride(1), out.stride(0), splits,
            cfg["MAX_SPIN"])
    resident = (_programs_per_sm(softmax_split_sync_kernel, args, meta, device)
                * _sm_count(device, arch))
    groups = min(m, resident // splits)
    if groups == 0:
        return False
    try:
        softmax_split_sync_kernel[(groups * splits,)](*args, **meta)
    except RuntimeError as e:  # the driver refused the cooperative grid: our occupancy was optimistic
        if "COOPERATIVE" not in str(e).upper():
            raise
        _COOPERATIVE_TOO_LARGE.add(key)
        return False
    return True


# ------------------------------------------------------------------------------------------------
# backward
# ------------------------------------------------------------------------------------------------
def softmax_backward(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor) -> None:
    """dx = y·(dy − Σ y·dy) per row, for (M, N) y and dy of any strides into a row-major dx."""
    _check_sizes("y", y)
    if dy.shape != y.shape:
        raise ValueError(f"dy must have y's shape {tuple(y.shape)}, got {tuple(dy.shape)}")
    _check_out("dx", dx, y)
    m, n = y.shape
    device = y.device
    arch = configs.arch(device)
    variant = "backward_" + _choose(m, n, arch, y.dtype, device, "backward_row_max_n")
    cfg = _config(variant, n, arch, y.dtype, _col_contig(y) and _col_contig(dy))
    strides = (y.stride(0), y.stride(1), dy.stride(0), dy.stride(1))
    contig = dict(Y_CONTIG=_col_contig(y), DY_CONTIG=_col_contig(dy))
    with _device_guard(device):
        if variant == "backward_split":
            splits, chunk = _split_plan(m, n, cfg, device, arch)
            grid = (splits * triton.cdiv(m, cfg["BLOCK_M"]),)
            dots = torch.empty((m, splits), dtype=torch.float32, device=device)
            common = dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], **contig,
                          **_launch_options(cfg))
            softmax_backward_dot_kernel[grid](y, dy, dots, m, n, *strides, chunk, splits, **common)
            softmax_backward_split_kernel[grid](y, dy, dx, dots, m, n, *strides, dx.stride(0), chunk,
                                                splits, BLOCK_S=triton.next_power_of_2(splits),
                                                **common)
            return
        one_tile = variant == "backward_row"
        block_n = triton.next_power_of_2(n) if one_tile else cfg["BLOCK_N"]
        meta = dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=block_n, ONE_TILE=one_tile,
                    MASK_N=one_tile and block_n != n, **contig, **_launch_options(cfg))
        args = (y, dy, dx, m, n, *strides, dx.stride(0))
        blocks = triton.cdiv(m, cfg["BLOCK_M"])
        per_sm = (_programs_per_sm(softmax_backward_kernel, args, meta, device) if one_tile
                  else cfg["PROGRAMS_PER_SM"])
        grid = (min(blocks, per_sm * _sm_count(device, arch)),)
        softmax_backward_kernel[grid](*args, **meta)
