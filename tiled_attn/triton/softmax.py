"""The Triton softmax backend: plan_forward / plan_backward validate the kernel choice, look up its
config and return the launches as a function run(x, out) (run(y, dy, dx)), which tiled_attn/softmax.py
caches per signature; "row" and "online" launch through their compiled kernels (launch.py).

The dispatcher (tiled_attn/softmax.py) hands over an (M, N) view with any strides and a row-major
(M, N) output; it has already validated dtype/device and never passes an empty tensor. The run
function gets tensors with the same data layout (the original tensor, whose data pointer is the
view's: the row/online kernels need only pointers and the planned sizes and strides). Kernels:
  "row"    the row is one tile in registers: one read, one write (N up to 32768).
  "online" any N: one pass folding tiles into the online state, a reverse pass normalizing.
  "split"  few huge rows: S programs per row, partial states merged through an (M, S) buffer
           (two kernels, x read twice); or, where the "split" config row of the size class sets
           SINGLE_PASS, one cooperative kernel whose S co-resident programs per row exchange their
           states and normalize without a second read of x (softmax_split_sync.py).
kernel=None picks by TRITON_SOFTMAX_DEFAULT (configs.py): "row" while the row fits on chip, else
"split" when there are too few rows to fill the SMs or the size class runs the single pass (it
reads x once, so it wins for any M), else "online". The backward picks the same way among its row /
looped / split variants (it has no single pass).
Every config field beyond tile sizes is optional with the old behaviour as default (configs.py
lists them): STAGES (cp.async pipelining of a tile loop), EVICT (cache hints), WAVES (row grid),
maxnreg (a register cap passed to ptxas).
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import math
from typing import NamedTuple

import torch
import triton

from .. import configs
from .launch import Launch
from .softmax_backward import softmax_backward_kernel
from .softmax_backward_split import softmax_backward_dot_kernel, softmax_backward_split_kernel
from .softmax_online import softmax_online_kernel
from .softmax_io import vec_width
from .softmax_row import softmax_row_kernel
from .softmax_split import softmax_split_normalize_kernel, softmax_split_state_kernel
from .softmax_split_sync import softmax_split_sync_kernel

__all__ = ["SOFTMAX_KERNELS", "plan_forward", "plan_backward", "softmax_forward", "softmax_backward"]

SOFTMAX_KERNELS = ("row", "online", "split")
# Rows of any length (DESIGN §3: billions of columns on the default backend): column indices are
# int64 on rows of _INT64_N columns or more, int32 below (softmax_io.py says how).
_INT64_N = 2**31  # Triton passes an integer argument of this value or more as an int64
_ROW_MIN_CLASS = 32  # the narrowest "row" size class in configs.TRITON_SOFTMAX (GPU rows)
# The float32 log-softmax backward takes e^y in float64 per element (softmax_backward.py): in one
# tile of 16384 columns (32 warps, 64 registers a thread) that spilled 56 bytes on sm_90a, so its
# rows past 8192 columns take the looped backward.
_LOG_FP32_ROW_MAX_N = 8192


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


@functools.lru_cache(maxsize=None)
def _libcuda():
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor
    fn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return lib


def _driver_programs_per_sm(compiled, threads: int) -> int | None:
    """The driver's own count (cuOccupancyMaxActiveBlocksPerMultiprocessor) for a loaded kernel:
    the figure a cooperative launch is checked against. None where it cannot be asked."""
    try:
        n = ctypes.c_int(0)
        rc = _libcuda().cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(n), ctypes.c_void_p(compiled.function), threads, compiled.metadata.shared)
    except Exception:  # noqa: BLE001 -- no libcuda symbol / handle: use our own count
        return None
    return n.value if rc == 0 and n.value > 0 else None


def _programs_per_sm(fn, args: tuple, meta: dict, device: torch.device) -> int:
    """How many programs of this compiled kernel fit on one SM at once (Triton tutorial 02).

    Compiles the kernel for these arguments (fn.warmup: the launch that follows reuses it) and
    divides the SM's registers, shared memory and thread slots by what one program takes; where the
    driver answers cuOccupancyMaxActiveBlocksPerMultiprocessor, the smaller of the two counts (the
    driver's is what a cooperative launch is held to). Cached per (kernel, meta-parameters, dtypes,
    device); other specializations of the same kernel (another alignment of the strides) differ by
    a few registers at most.
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
        driver = _driver_programs_per_sm(compiled, num_warps * warp)
        if driver is not None:
            fits.append(driver)
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
    if row_limit == "row_max_n" and _config("split", n, arch, dtype).get("SINGLE_PASS"):
        return "split"
    return "online"


def _check_sizes(what: str, t: torch.Tensor) -> None:
    if t.dim() != 2:
        raise ValueError(f"{what} must be an (M, N) matrix, got shape {tuple(t.shape)}")


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


def _vec(x: torch.Tensor, out: torch.Tensor) -> dict:
    """The VEC constexpr of the row kernel (softmax_row.py), left out where it is 1 (a row that
    16 divides, or one that nothing packs): those launches stay the kernel without the switch."""
    m, n = x.shape
    if not _col_contig(x) or n % 16 == 0 or m == 0:
        return {}
    strides = (x.stride(0), out.stride(0)) if m > 1 else ()
    vec = vec_width(x.element_size(), n, *strides)
    return {"VEC": vec} if vec > 1 else {}


# The row kernel's window reads (softmax_row.py WIN) on rows that start off the 16-byte grid, where
# configs.TRITON_SOFTMAX_WINDOW lists N; None follows that table, True / False forces them on / off
# for every row (benchmarks/probe_softmax_window.py times the same plan both ways).
WINDOW: bool | None = None
# The row kernel's output from update's own exponentials (softmax_row.py KEEP_P); False is the A/B
# baseline (normalize recomputes them), for benchmarks/probe_softmax_window.py only.
KEEP_P = True


def _win(x: torch.Tensor, out: torch.Tensor, block_m: int, block_n: int, arch: str) -> dict:
    """The WIN constexpr of the row kernel (softmax_row.py), left out where it does not apply: rows
    that start on the 16-byte grid already (N·size a multiple of 16), a tensor whose rows are not
    back to back in x and out (row stride N), a window (N + WIN − 1 columns) past the tile, or fewer
    than two row blocks (the block holding the last row loads element by element: one block would
    take no packs at all)."""
    m, n = x.shape
    win = 16 // x.element_size()
    on = configs.triton_softmax_window(arch, configs.dtype_key(x.dtype), n) if WINDOW is None else WINDOW
    if (not on or n * x.element_size() % 16 == 0 or n < 2 * win or not _col_contig(x)
            or x.stride(0) != n or out.stride(0) != n or n + win - 1 > block_n or m < 2 * block_m):
        return {}
    return {"WIN": win}


def _launch_options(cfg: dict) -> dict:
    opts = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if cfg.get("maxnreg"):
        opts["maxnreg"] = cfg["maxnreg"]  # ptxas register cap: more programs per SM
    return opts


def _log(log: bool) -> dict:
    """The LOG constexpr (log-softmax) of a launch, left out for softmax: its launches, compiled
    kernels and occupancy keys stay those of a kernel without the switch."""
    return {"LOG": True} if log else {}


def _hints(cfg: dict, *names: str) -> dict:
    """The cache-hint constexprs of softmax_io.py for a config: with EVICT, data re-read by a later
    pass is loaded evict_last (KEEP), a last read evict_first (LAST), the output streamed (STORE)."""
    on = bool(cfg.get("EVICT"))
    values = {"KEEP": "evict_last" if on else "", "LAST": "evict_first" if on else "",
              "STORE": ".cs" if on else ""}
    return {k: values[k] for k in names}


# ------------------------------------------------------------------------------------------------
# forward
# ------------------------------------------------------------------------------------------------
def plan_forward(x: torch.Tensor, out: torch.Tensor, kernel: str | None, log: bool = False):
    """The launches of out[i, :] = softmax(x[i, :]) (log-softmax with `log`) for an (M, N) x of any
    strides into a row-major (M, N) out, as a function run(x, out) of tensors with the same shapes,
    strides, dtype and device (tiled_attn/softmax.py caches it per signature). Validates the kernel
    name and sizes. log-softmax runs the same kernels and configs (one more constexpr, LOG)."""
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
    if kernel == "row":
        return _plan_row(x, out, cfg, device, arch, log)
    if kernel == "online":
        return _plan_online(x, out, cfg, device, arch, log)
    return _plan_split(x, out, cfg, device, arch, log)


def softmax_forward(x: torch.Tensor, out: torch.Tensor, kernel: str | None, log: bool = False) -> None:
    """out[i, :] = softmax(x[i, :]) (log-softmax with `log`) for an (M, N) x of any strides into a
    row-major (M, N) out (planned for this one call: the sweeps and tests call it; ta.softmax
    caches the plan)."""
    plan_forward(x, out, kernel, log)(x, out)


def _plan_row(x, out, cfg, device, arch, log=False):
    m, n = x.shape
    block_n = triton.next_power_of_2(n)
    # Rows narrower than the smallest measured class keep its tile's elements: BLOCK_M rows of 1
    # column would give a program one element a warp (the H200's random-shape sweep, 2026-11-26:
    # 5597494x1 fp32 at 0.10x torch.softmax with the 32-column class's 16 rows).
    block_m = cfg["BLOCK_M"] * max(1, _ROW_MIN_CLASS // block_n)
    meta = dict(BLOCK_M=block_m, BLOCK_N=block_n, COL_CONTIG=_col_contig(x),
                MASK_N=block_n != n, STAGES=cfg.get("STAGES", 1), **_hints(cfg, "LAST", "STORE"),
                **_log(log), **_vec(x, out), **_win(x, out, block_m, block_n, arch),
                **({} if KEEP_P else {"KEEP_P": False}), **_launch_options(cfg))
    ints = (m, n, x.stride(0), x.stride(1), out.stride(0))
    blocks = triton.cdiv(m, block_m)
    waves = cfg.get("WAVES", 1)
    if waves:  # a persistent grid of `waves` × what fits on the GPU at once
        with _device_guard(device):
            per_sm = _programs_per_sm(softmax_row_kernel, (x, out, *ints), meta, device)
        blocks = min(blocks, math.ceil(waves * per_sm * _sm_count(device, arch)))
    return Launch(softmax_row_kernel, (blocks,), meta, device).bind(*ints)


def _plan_online(x, out, cfg, device, arch, log=False):
    m, n = x.shape
    blocks = triton.cdiv(m, cfg["BLOCK_M"])
    grid = (min(blocks, cfg["PROGRAMS_PER_SM"] * _sm_count(device, arch)),)
    meta = dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], COL_CONTIG=_col_contig(x),
                STAGES=cfg.get("STAGES", 1), **_hints(cfg, "KEEP", "LAST", "STORE"), **_log(log),
                **_launch_options(cfg))
    ints = (m, n, x.stride(0), x.stride(1), out.stride(0))
    return Launch(softmax_online_kernel, grid, meta, device).bind(*ints)


def _plan_split(x, out, cfg, device, arch, log=False):
    """The split's launches, planned once: the single pass where the "split" row asks for it and its
    programs fit on the device at once, else (or when the driver refuses its cooperative grid) the
    two kernels. Planned per call before 2026-11-26, that cost the host ~100 µs a call, more than
    the kernel of a 64x1048576 bf16 row (H200: 817 GB/s eager, 1640 in a CUDA graph)."""
    m, n = x.shape
    # Rows of 2^31 columns or more take the two kernels: the single pass's chunks (n over the
    # co-resident programs, millions of columns each) are far past L2, so its re-read comes from
    # DRAM like the second kernel's, and its int64-index build spills under the maxnreg = 80
    # configs (sm_90a: 644-696 bytes; the two-kernel split's builds do not spill).
    with _device_guard(device):
        sync = (_plan_split_sync(x, out, device, arch, log) if cfg.get("SINGLE_PASS") and n < _INT64_N
                else None)
        two = _plan_split_two(x, out, cfg, device, arch, log)
    if sync is None:
        return two

    def run(x, out):
        if not _forward_split_sync(sync, x, out):
            two(x, out)
    return run


def _plan_split_two(x, out, cfg, device, arch, log=False):
    m, n = x.shape
    splits, chunk = _split_plan(m, n, cfg, device, arch)
    grid = (splits * triton.cdiv(m, cfg["BLOCK_M"]),)
    common = dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], COL_CONTIG=_col_contig(x),
                  STAGES=cfg.get("STAGES", 1), **_launch_options(cfg))
    state = Launch(softmax_split_state_kernel, grid, dict(common, **_hints(cfg, "KEEP")), device)
    normalize = Launch(softmax_split_normalize_kernel, grid,
                       dict(common, BLOCK_S=triton.next_power_of_2(splits), **_hints(cfg, "LAST", "STORE"),
                            **_log(log)), device)
    x_ints = (m, n, x.stride(0), x.stride(1))
    out_stride = out.stride(0)

    def run(x, out):
        # Unwritten state slots would be read by the merge: every (row, split) program writes its own.
        m_parts = torch.empty((m, splits), dtype=torch.float32, device=device)
        l_parts = torch.empty((m, splits), dtype=torch.float32, device=device)
        state(x, m_parts, l_parts, *x_ints, chunk, splits)
        normalize(x, out, m_parts, l_parts, *x_ints, out_stride, chunk, splits)
    return run


_COOPERATIVE_TOO_LARGE: set = set()  # (meta, dtype, device) whose cooperative launch was refused
_SYNC_FAILURES: dict = {}  # device -> int32 counter of timed-out waits (softmax_split_sync.py)


def _sync_failure_counter(device: torch.device) -> torch.Tensor:
    if device not in _SYNC_FAILURES:
        _SYNC_FAILURES[device] = torch.zeros((1,), dtype=torch.int32, device=device)
    return _SYNC_FAILURES[device]


def split_sync_failures(device: torch.device | str) -> int:
    """How many row waits of the single-pass split timed out on `device` since the process started
    (their rows were written as NaN). Nonzero means the co-residency invariant broke: a bug to
    report. Synchronizes with the device; the tests and the tuning sweep check it."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    counter = _SYNC_FAILURES.get(device)
    return 0 if counter is None else int(counter.item())


def _sync_plan(n: int, cfg: dict, resident: int) -> tuple[int, int]:
    """(S, CHUNK) for the single pass: chunks of T ≥ CHUNK_TILES tiles, T raised until one row's S
    chunks fit in the `resident` co-resident programs (T = 1: the row is read once)."""
    block_n = cfg["BLOCK_N"]
    tiles = triton.cdiv(n, block_n)
    t = max(cfg.get("CHUNK_TILES", 1), triton.cdiv(tiles, max(resident, 1)))
    chunk = t * block_n
    return triton.cdiv(n, chunk), chunk


class _SyncPlan(NamedTuple):
    launch: Launch
    m: int
    splits: int
    ints: tuple  # the launch's integer arguments after the tensors
    key: tuple  # _COOPERATIVE_TOO_LARGE's key
    fails: torch.Tensor  # the device's timed-out-wait counter (_sync_failure_counter)


def _plan_split_sync(x, out, device, arch, log=False) -> _SyncPlan | None:
    """The single-pass split, if its programs fit on the device at once; None to fall back."""
    m, n = x.shape
    cfg = _config("split_sync", n, arch, x.dtype, _col_contig(x))
    block_n = cfg["BLOCK_N"]
    base = dict(BLOCK_N=block_n, COL_CONTIG=_col_contig(x), STAGES=cfg.get("STAGES", 1),
                **_hints(cfg, "KEEP", "LAST", "STORE"), **_log(log), **_launch_options(cfg))
    if device.type == "cuda":
        base["launch_cooperative_grid"] = True
    fails = _sync_failure_counter(device)

    def meta(splits, chunk):
        # PREFETCH holds a second register tile: only where the chunk is one tile (T = 1).
        return dict(base, BLOCK_S=triton.next_power_of_2(splits),
                    PREFETCH=bool(cfg.get("PREFETCH")) and chunk == block_n)

    def ints(splits, chunk):
        return (m, n, x.stride(0), x.stride(1), out.stride(0), splits, chunk, cfg["MAX_SPIN"])

    def resident(kernel_meta):
        if device.type != "cuda":
            return 1  # the interpreter runs programs in turn: a wait for a later one never ends
        empty = torch.empty((1,), dtype=torch.float32, device=device)
        # CHUNK as the launch passes it (a multiple of BLOCK_N), not n: a row of 2^31 columns or
        # more would make it an int64, another specialization than the one launched.
        per_sm = _programs_per_sm(softmax_split_sync_kernel,
                                  (x, out, empty, empty, counts_probe, fails, *ints(1, chunk0)), kernel_meta,
                                  device)
        return per_sm * _sm_count(device, arch)

    counts_probe = torch.empty((1,), dtype=torch.int32, device=device)
    # Plan with the occupancy of the T = CHUNK_TILES kernel, then take the occupancy of the kernel
    # the plan launches (a longer chunk drops PREFETCH, more splits widen BLOCK_S).
    chunk0 = cfg.get("CHUNK_TILES", 1) * block_n
    probe = meta(min(triton.cdiv(n, chunk0), 1024), chunk0)
    splits, chunk = _sync_plan(n, cfg, resident(probe))
    final = meta(splits, chunk)
    fit = resident(final)  # cached when final == probe
    groups = min(m, fit // splits)
    key = (tuple(sorted(final.items())), x.dtype, device)
    if groups == 0 or key in _COOPERATIVE_TOO_LARGE:
        return None
    return _SyncPlan(Launch(softmax_split_sync_kernel, (groups * splits,), final, device), m, splits,
                     ints(splits, chunk), key, fails)


def _forward_split_sync(plan: _SyncPlan, x, out) -> bool:
    """One call's single pass; False where the driver refused its cooperative grid (our occupancy
    was optimistic: remembered, and every later call of that kernel takes the two kernels)."""
    if plan.key in _COOPERATIVE_TOO_LARGE:
        return False
    device = plan.launch.device
    m_parts = torch.empty((plan.m, plan.splits), dtype=torch.float32, device=device)
    l_parts = torch.empty((plan.m, plan.splits), dtype=torch.float32, device=device)
    counts = torch.zeros((plan.m,), dtype=torch.int32, device=device)
    try:
        plan.launch(x, out, m_parts, l_parts, counts, plan.fails, *plan.ints)
    except RuntimeError as e:
        if "COOPERATIVE" not in str(e).upper():
            raise
        _COOPERATIVE_TOO_LARGE.add(plan.key)
        return False
    return True


# ------------------------------------------------------------------------------------------------
# backward
# ------------------------------------------------------------------------------------------------
def plan_backward(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, log: bool = False):
    """The launches of dx = y·(dy − Σ y·dy) per row (with `log`, y the log-softmax output:
    dx = dy − e^y·Σ dy), for (M, N) y and dy of any strides into a row-major dx, as a function
    run(y, dy, dx) (see plan_forward)."""
    _check_sizes("y", y)
    if dy.shape != y.shape:
        raise ValueError(f"dy must have y's shape {tuple(y.shape)}, got {tuple(dy.shape)}")
    _check_out("dx", dx, y)
    m, n = y.shape
    device = y.device
    arch = configs.arch(device)
    variant = "backward_" + _choose(m, n, arch, y.dtype, device, "backward_row_max_n")
    if log and variant == "backward_row" and y.dtype == torch.float32 and n > _LOG_FP32_ROW_MAX_N:
        variant = "backward_online"
    cfg = _config(variant, n, arch, y.dtype, _col_contig(y) and _col_contig(dy))
    ints = (m, n, y.stride(0), y.stride(1), dy.stride(0), dy.stride(1))
    contig = dict(Y_CONTIG=_col_contig(y), DY_CONTIG=_col_contig(dy), **_log(log))
    if variant == "backward_split":
        splits, chunk = _split_plan(m, n, cfg, device, arch)
        grid = (splits * triton.cdiv(m, cfg["BLOCK_M"]),)
        # float32 inputs sum y·dy in float64 (softmax_backward.py says why).
        dot_dtype = torch.float64 if y.dtype == torch.float32 else torch.float32
        common = dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], **contig, **_launch_options(cfg))
        dot = Launch(softmax_backward_dot_kernel, grid, common, device)
        scale = Launch(softmax_backward_split_kernel, grid,
                       dict(common, BLOCK_S=triton.next_power_of_2(splits)), device)

        dx_stride = dx.stride(0)

        def run(y, dy, dx):
            dots = torch.empty((m, splits), device=device, dtype=dot_dtype)
            dot(y, dy, dots, *ints, chunk, splits)
            scale(y, dy, dx, dots, *ints, dx_stride, chunk, splits)
        return run
    one_tile = variant == "backward_row"
    block_n = triton.next_power_of_2(n) if one_tile else cfg["BLOCK_N"]
    meta = dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=block_n, ONE_TILE=one_tile,
                MASK_N=one_tile and block_n != n, **contig, **_launch_options(cfg))
    ints = ints + (dx.stride(0),)
    blocks = triton.cdiv(m, cfg["BLOCK_M"])
    with _device_guard(device):
        per_sm = (_programs_per_sm(softmax_backward_kernel, (y, dy, dx, *ints), meta, device) if one_tile
                  else cfg["PROGRAMS_PER_SM"])
    grid = (min(blocks, per_sm * _sm_count(device, arch)),)
    return Launch(softmax_backward_kernel, grid, meta, device).bind(*ints)


def softmax_backward(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, log: bool = False) -> None:
    """dx = y·(dy − Σ y·dy) per row (log: dy − e^y·Σ dy; planned for this one call; see
    softmax_forward)."""
    plan_backward(y, dy, dx, log)(y, dy, dx)
