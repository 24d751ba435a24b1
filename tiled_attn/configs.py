"""Launch configs as data: tables keyed by (kernel, arch, dtype, size class), no literals in wrappers.

Each table maps a key to a dict of launch parameters; `lookup` falls back from the exact arch to
"any", so a new GPU runs on the generic rows until it is measured. Every figure that chose a row is
in benchmarks/results/ (the file is named next to the table). Rows for "cpu" are the sizes the
Triton interpreter uses in CI: small blocks keep it fast; they are never timed.
"""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def _arch_of(index: int) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm{major}{minor}"


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def arch(device: torch.device) -> str:
    """'sm90' for an H100, 'cpu' for tensors the Triton interpreter runs."""
    if device.type != "cuda":
        return "cpu"
    return _arch_of(_index(device))


def model_key(name: str) -> str:
    """A GPU's model in a device name: "NVIDIA H100 80GB HBM3" -> "h100", "NVIDIA H200" -> "h200"
    (the first word with a digit)."""
    words = name.lower().replace("nvidia", " ").split()
    return next((w for w in words if any(c.isdigit() for c in w)), words[0] if words else "gpu")


@functools.lru_cache(maxsize=None)
def _model_of(index: int) -> str:
    return model_key(torch.cuda.get_device_name(index))


def model_arch(device: torch.device) -> str:
    """arch(device) with the GPU model, 'sm90:h200': the key of the tables measured per model
    (SOFTMAX_SELECT), whose lookups fall back to arch(device) ('sm90'). Same SMs, different memory
    and host: the H200's 1.4x copy bandwidth moves where a call is bound by the host, which decides
    the selection on small shapes."""
    a = arch(device)
    if device.type != "cuda":
        return a
    return f"{a}:{_model_of(_index(device))}"


def base_arch(key: str) -> str:
    """'sm90' for 'sm90:h200' (and for 'sm90')."""
    return key.partition(":")[0]


def dtype_key(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
            torch.float64: "fp64"}[dtype]


def lookup(table: dict, key: tuple, what: str) -> dict:
    """Exact key first, then the same key with arch 'any' (arch is always key[1])."""
    if key in table:
        return table[key]
    generic = (key[0], "any") + tuple(key[2:])
    if generic in table:
        return table[generic]
    raise KeyError(f"no launch config for {what} {key}: add a row to tiled_attn/configs.py")


class _Table(dict):
    """A dict that drops every cached plan when it changes: plans (tiled_attn/_plan.py) are made
    from the rows as they were."""

    def _changed(self):
        from . import _plan
        _plan.clear_all()  # every cached plan was made from the tables as they were

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self._changed()

    def __delitem__(self, key):
        super().__delitem__(key)
        self._changed()

    def clear(self):
        super().clear()
        self._changed()

    def update(self, *args, **kwargs):
        super().update(*args, **kwargs)
        self._changed()

    def pop(self, *args):
        self._changed()
        return super().pop(*args)

    def popitem(self):
        self._changed()
        return super().popitem()

    def setdefault(self, key, default=None):
        self._changed()
        return super().setdefault(key, default)


# ---------------------------------------------------------------------------------------------
# Default backend per op and device (DESIGN §3: None picks the fastest measured for the device).
# ---------------------------------------------------------------------------------------------
# On the CPU backend=None runs torch's own softmax / SDPA wherever they compute the same thing
# (tiled_attn/softmax.py, attention.py: "native"); the "cpu" rows are what runs where they do not.
DEFAULT_BACKEND = _Table({
    # (op, device type): backend
    ("softmax", "cpu"): "torch",
    ("softmax", "cuda"): "triton",
    ("attention", "cpu"): "torch",
    ("attention", "cuda"): "triton",
})

# backend=None's attention forward on a CUDA device where a measured kernel beats DEFAULT_BACKEND's.
# Key: (arch, head dim, causal); fp16 and bf16 alike (the kernels' speed does not depend on which).
# arch as configs.arch() gives it: the rows are compute-bound choices, measured on an H200 ("sm90": the
# H100 has the same SMs and clocks; its lower memory bandwidth matters little at these sizes).
# Value: rows (n_min, backend, kernel), read in order: the first with min(Nq, Nk) >= n_min applies;
# none (or no key): DEFAULT_BACKEND's choice. A "cuda" row also gives backend="cuda" its kernel at
# that size (tiled_attn/cuda/attention.py select_kernel; "mma" where no cuda row applies). Only for
# plain calls (no window, softcap, ALiBi, key mask, varlen or cache) whose q, k, v the CUDA kernels
# read in place, and only where the CUDA extension can be built (cuda.is_available(): a first call
# then builds it). attention_select() reads it; tests/test_cuda_attention_sm90.py checks its shape.
# Rows: benchmarks/sweep_cuda_attention.py --ws --cudnn --triton (H200, the Triton forward and the
# wgmma_ws tiles timed in the same interleaved rounds, B·N = 32k tokens, H·D = 2048, bf16, N 512-16k;
# benchmarks/results/sweeps/2026-11-26-h200-s16-sm90-ws-tiles.md, D = 64 / 128, and
# 2026-11-29-h200-s27-sm90-ws-tiles.md, D = 96 / 192 / 256). TFLOP/s wgmma_ws vs Triton:
ATTENTION_SELECT = _Table({
    # D = 64: 421-455 vs 411-417 at N 4k-16k; Triton ahead below (255-390 vs 331-407) and causal. The
    # persistent grid (session 28, kernel time): +11% at N = 2048 (418 against 376 one CTA per tile),
    # past the Triton forward's 407 there: from 2048.
    ("sm90", 64, False): ((2048, "cuda", "wgmma_ws"),),
    # D = 96 (on 128-column tiles): 341-534 vs 293-363; causal 217-525 vs 206-360.
    ("sm90", 96, False): ((512, "cuda", "wgmma_ws"),),
    ("sm90", 96, True): ((512, "cuda", "wgmma_ws"),),
    # D = 128: 402-650 vs 382-506 at every N; causal 364-644 vs 361-517 from N = 1024 (251 vs 262 at 512;
    # the persistent grid, session 28: +20% at causal N = 512, kernel time: from 512).
    ("sm90", 128, False): ((512, "cuda", "wgmma_ws"),),
    ("sm90", 128, True): ((512, "cuda", "wgmma_ws"),),
    # D = 192 (K and V released apart): 454-675 vs 295-387; causal 298-674 vs 197-394.
    ("sm90", 192, False): ((512, "cuda", "wgmma_ws"),),
    ("sm90", 192, True): ((512, "cuda", "wgmma_ws"),),
    # D = 256 (K and V released apart since session 27): 498-738 vs 318-480; causal 319-738 vs 227-494.
    ("sm90", 256, False): ((512, "cuda", "wgmma_ws"),),
    ("sm90", 256, True): ((512, "cuda", "wgmma_ws"),),
})


def attention_select(arch_key: str, d: int, causal: bool, n: int) -> tuple[str, str] | None:
    """(backend, kernel) of the first ATTENTION_SELECT row of (arch_key, d, causal) with
    n >= n_min (n = min(Nq, Nk)), or None. Pure: no device is read."""
    for n_min, backend, kernel in ATTENTION_SELECT.get((arch_key, int(d), bool(causal)), ()):
        if n >= n_min:
            return backend, kernel
    return None


# ---------------------------------------------------------------------------------------------
# Triton softmax (tiled_attn/triton/softmax.py) — owned by that module's author.
# ---------------------------------------------------------------------------------------------
# Key: (kernel, arch, dtype, size class). dtype may be "any"; the size class is an upper bound on N
# (the row length). Lookup (triton_softmax_config): exact arch before "any", exact dtype before
# "any" dtype; the first of these (kernel, arch, dtype) tables whose largest class covers N gives
# the row of the smallest class >= N. So measured "sm90" rows may cover only the sizes they were
# measured at (the sweep's ladder), and longer rows fall through to the "any" rows.
# Kernels: the forward "row", "online", "split", "split_sync" (the single pass) and the backward
# "backward_row" (row on chip), "backward_online" (looped), "backward_split".
# Fields: BLOCK_M rows × BLOCK_N columns per tile ("row"/"backward_row" take BLOCK_N =
# next_pow2(N): the whole row is the tile); num_warps, num_stages as Triton launch options (the
# launch option num_stages pipelines nothing in these kernels: their loads feed no dot);
# PROGRAMS_PER_SM sizes a persistent grid by a fixed count per SM (kernels without it that loop over
# rows get as many programs as fit on an SM, from the compiled kernel's occupancy); the split
# kernels aim for PROGRAMS_PER_SM·SMs programs in all and cut a row into chunks of at least
# MIN_TILES tiles. Optional fields (absent = the default in brackets):
#   STAGES [1]    > 1: software-pipeline the kernel's tile loop (the row kernel: its row-block loop)
#                 through tl.range(num_stages=STAGES), i.e. cp.async copies STAGES − 1 tiles ahead
#                 into shared memory (STAGES − 1 tiles of shared memory per program).
#   EVICT [False] cache hints: first reads that a later pass re-reads evict_last, last reads
#                 evict_first, output stores streaming (.cs).
#   WAVES [1]     "row": the persistent grid is WAVES × the programs that fit at once; 0 = one
#                 program per row block.
#   maxnreg       a register cap per thread for ptxas (more programs per SM); every row with one is
#                 compiled by the sm_90a spill test.
#   SINGLE_PASS [False]  "split": use the single-pass kernel (its "split_sync" row) for this size
#                 class, and choose "split" for it whatever M (it reads x once, so it beats
#                 "online"); the two-kernel fields of the row are its fallback.
#   "split_sync": BLOCK_N columns per program held in registers across the wait, CHUNK_TILES the
#                 fewest tiles per program (1: x read once; the wrapper raises it until a row fits
#                 the co-resident programs, the extra tiles re-read from L2), PREFETCH (load the
#                 next row's tile during the wait, T = 1 only), MAX_SPIN (polls before a wait gives
#                 up and writes NaN: see softmax_split_sync.py).
#
# The "any" rows are first guesses for the H100, partly measured (benchmark 2026-11-22,
# /work/notes/gpu/call6: "row" 88-93% of copy fp32 and bf16, "online" 64%, "split" 24-65%); the
# "sm90" rows that benchmarks/sweep_triton_softmax.py writes replace them per measured size.
# Reasoning behind the "any" rows:
# * 16-byte loads need 4 fp32 / 8 bf16 consecutive elements per thread; tiles hold 16-32 elements
#   per thread, i.e. 4-8 loads in flight per thread for fp32, enough with several programs per SM
#   (the H100 needs ~3.3 MB in flight, ~25 KB per SM, to cover DRAM latency at 3.35 TB/s).
# * "row": a short row gets many rows per tile so a tile stays ~4K elements (N = 32 → 128 rows);
#   long rows add warps rather than elements per thread. The register file bounds the row: an SM
#   has 64K 32-bit registers and a row needs one per column for x plus, around the sum, one per
#   column for exp(x − m) unless the compiler recomputes it. ptxas -v for sm_90a (Triton 3.6,
#   compiled without a GPU by tests/test_softmax.py::test_triton_kernels_compile_for_sm90a, which
#   fails on any spill of these rows): fp32 16384 columns / 16 warps: 62 registers per thread,
#   32768 / 32 warps: 48, no spills in either (exp(x − m) is recomputed, not kept), so rows up to
#   32768 columns run on chip (1-2 programs per SM). A bf16 tile of the same elements is half the
#   bytes in flight (measured 86-88% of copy where fp32 reaches 92%): the sweep tries larger bf16
#   tiles, the cp.async-pipelined loop (STAGES) and a non-persistent grid (WAVES = 0).
# * "online"/"backward_online": one program per SM keeps the rows in flight small enough for the
#   reverse re-read to hit L2 (132 × 512 KB rows = 66 MB vs 50 MB of L2), so that one program
#   alone must keep enough bytes in flight: 32 KB tiles over 16 warps, and (sweep) STAGES.
# * "split": ~4 programs per SM in all (4 × 16 KB in flight per SM), chunks of >= 4 tiles so the
#   per-chunk setup and the merge are amortized.
# * "split_sync": 8192 columns over 8 warps is 32 fp32 values a thread; the kernel needs 116-128
#   registers uncapped (2 programs an SM) and 80 with maxnreg=80 without a spill (ptxas, sm_90a):
#   3 programs an SM, 396 on the H100 holding 12.7 MB of rows, e.g. 24 rows of 131072 fp32
#   columns (S = 16) at a time. MAX_SPIN: 65536 polls of an L2 line (~1 µs each with the block
#   barriers around them) bound a wait at ~65 ms, where a real one lasts microseconds.
# * "backward_row" holds y and dy: half the elements of "row" per tile.
# * BLOCK_N_STRIDED: the tile when a row's columns are strided (a transposed view): every element
#   is then its own load with a 64-bit address, and a 16K-element tile spills (ptxas: online bf16,
#   255 registers + 1.8 KB of spills); 2048 columns keep the addresses in registers.
# The "cpu" rows are for the interpreter (CI): small tiles so modest N exercises multi-tile loops,
# loop tails and several splits; never timed.
import bisect  # noqa: E402  (used by this section only)

_INF = float("inf")
# The two-kernel split's tiles (the "any" rows, and the sm90 rows that turn the single pass on).
_SPLIT_FP32 = dict(BLOCK_M=1, BLOCK_N=4096, BLOCK_N_STRIDED=2048, num_warps=8, num_stages=1,
                   PROGRAMS_PER_SM=4, MIN_TILES=4)
_SPLIT_ANY = dict(_SPLIT_FP32, BLOCK_N=8192)
TRITON_SOFTMAX: dict = _Table({
    # ---- row: the row is one tile in registers -------------------------------------------------
    ("row", "any", "any", 32): dict(BLOCK_M=128, num_warps=4, num_stages=2),
    ("row", "any", "any", 128): dict(BLOCK_M=32, num_warps=4, num_stages=2),
    ("row", "any", "any", 512): dict(BLOCK_M=8, num_warps=4, num_stages=2),
    ("row", "any", "any", 1024): dict(BLOCK_M=4, num_warps=4, num_stages=2),
    ("row", "any", "any", 2048): dict(BLOCK_M=2, num_warps=8, num_stages=2),
    ("row", "any", "any", 4096): dict(BLOCK_M=1, num_warps=8, num_stages=2),
    ("row", "any", "any", 8192): dict(BLOCK_M=1, num_warps=16, num_stages=2),
    ("row", "any", "any", 16384): dict(BLOCK_M=1, num_warps=16, num_stages=2),
    ("row", "any", "any", 32768): dict(BLOCK_M=1, num_warps=32, num_stages=1),
    # ---- online: BLOCK_N-column tiles of 32 KB ----------------------------------------------
    ("online", "any", "fp32", _INF): dict(BLOCK_M=1, BLOCK_N=8192, BLOCK_N_STRIDED=2048,
                                          num_warps=16, num_stages=1, PROGRAMS_PER_SM=1, maxnreg=128),
    ("online", "any", "any", _INF): dict(BLOCK_M=1, BLOCK_N=16384, BLOCK_N_STRIDED=2048,
                                         num_warps=16, num_stages=1, PROGRAMS_PER_SM=1, maxnreg=128),
    # ---- split: S programs per row, 16 KB tiles ----------------------------------------------
    ("split", "any", "fp32", _INF): dict(_SPLIT_FP32, SINGLE_PASS=False),
    ("split", "any", "any", _INF): dict(_SPLIT_ANY, SINGLE_PASS=False),
    # ---- split, single pass (softmax_split_sync.py): used where a "split" row sets SINGLE_PASS
    ("split_sync", "any", "any", _INF): dict(BLOCK_N=8192, BLOCK_N_STRIDED=2048, num_warps=8,
                                             num_stages=1, maxnreg=80, CHUNK_TILES=1,
                                             MAX_SPIN=1 << 16),
    # ---- backward ----------------------------------------------------------------------------
    ("backward_row", "any", "any", 32): dict(BLOCK_M=64, num_warps=4, num_stages=2),
    ("backward_row", "any", "any", 128): dict(BLOCK_M=16, num_warps=4, num_stages=2),
    ("backward_row", "any", "any", 512): dict(BLOCK_M=4, num_warps=4, num_stages=2),
    ("backward_row", "any", "any", 2048): dict(BLOCK_M=1, num_warps=4, num_stages=2),
    ("backward_row", "any", "any", 4096): dict(BLOCK_M=1, num_warps=8, num_stages=2),
    ("backward_row", "any", "any", 8192): dict(BLOCK_M=1, num_warps=16, num_stages=2),
    ("backward_row", "any", "any", 16384): dict(BLOCK_M=1, num_warps=32, num_stages=1),
    # looped / split backward: y and dy tiles of 16 KB each
    ("backward_online", "any", "fp32", _INF): dict(BLOCK_M=1, BLOCK_N=4096, BLOCK_N_STRIDED=2048,
                                                   num_warps=8, num_stages=1, PROGRAMS_PER_SM=1),
    # 16 warps: at 8, the fused-multiply-add accumulation spills 16 bytes in bf16 (ptxas, sm_90a).
    ("backward_online", "any", "any", _INF): dict(BLOCK_M=1, BLOCK_N=8192, BLOCK_N_STRIDED=2048,
                                                  num_warps=16, num_stages=1, PROGRAMS_PER_SM=1),
    ("backward_split", "any", "fp32", _INF): dict(BLOCK_M=1, BLOCK_N=4096, BLOCK_N_STRIDED=2048,
                                                  num_warps=8, num_stages=1, PROGRAMS_PER_SM=4,
                                                  MIN_TILES=4),
    ("backward_split", "any", "any", _INF): dict(BLOCK_M=1, BLOCK_N=8192, BLOCK_N_STRIDED=2048,
                                                 num_warps=8, num_stages=1, PROGRAMS_PER_SM=4,
                                                 MIN_TILES=4),
    # ---- interpreter (CI): a tile step costs ~5 ms there whatever its size, so tiles are as
    # large as still gives odd N multi-tile loops with tails (N = 1000 → 3 tiles + a tail);
    # BLOCK_M > 1 covers partial row blocks. tests/test_softmax.py forces 16-column tiles on top.
    ("row", "cpu", "any", 32): dict(BLOCK_M=16, num_warps=1, num_stages=1),
    ("row", "cpu", "any", 256): dict(BLOCK_M=4, num_warps=1, num_stages=1),
    ("row", "cpu", "any", 32768): dict(BLOCK_M=1, num_warps=1, num_stages=1),
    ("online", "cpu", "any", _INF): dict(BLOCK_M=4, BLOCK_N=256, num_warps=1, num_stages=1,
                                         PROGRAMS_PER_SM=1),
    ("split", "cpu", "any", _INF): dict(BLOCK_M=4, BLOCK_N=256, num_warps=1, num_stages=1,
                                        PROGRAMS_PER_SM=2, MIN_TILES=1, SINGLE_PASS=False),
    ("split_sync", "cpu", "any", _INF): dict(BLOCK_N=256, num_warps=1, num_stages=1, CHUNK_TILES=1,
                                             MAX_SPIN=4),
    ("backward_row", "cpu", "any", 32): dict(BLOCK_M=16, num_warps=1, num_stages=1),
    ("backward_row", "cpu", "any", 32768): dict(BLOCK_M=1, num_warps=1, num_stages=1),
    ("backward_online", "cpu", "any", _INF): dict(BLOCK_M=4, BLOCK_N=256, num_warps=1,
                                                  num_stages=1, PROGRAMS_PER_SM=1),
    ("backward_split", "cpu", "any", _INF): dict(BLOCK_M=4, BLOCK_N=256, num_warps=1,
                                                 num_stages=1, PROGRAMS_PER_SM=2, MIN_TILES=1),
    # ---- sm90: measured on the H100 by benchmarks/sweep_triton_softmax.py (paste its --out rows
    # here, with the date and the run's copy bandwidth).
    # 2026-11-22, copy 2971 GB/s, the sweep's first round (its run was cut before it wrote a file;
    # figures from its log, /work/notes/gpu/s2call1/sweep_softmax.log): the single pass against the
    # "any" kernels at the "any" tiles, % of copy: fp32 512x131072 89 vs 59 (online), 64x1048576
    # 70 vs 51 (split), 8x4194304 70 vs 52, 1x33554432 64 vs 64; bf16 67 vs 58, 55 vs 35, 56 vs 24,
    # 59 vs 60. So "split" runs the single pass at every length past the row kernel's.
    # (One line a row: the sweep's --apply replaces sm90 rows line by line.)
    # ---- sweep_triton_softmax.py --apply (begin): 2026-11-22, NVIDIA H100 80GB HBM3, copy 2970 GB/s.
    # A row is here where it beat the "any" row by >= 3% on the ladder shape of
    # its size class (the single pass: the default kernel); "= any" rows keep the
    # smaller classes on the "any" launch; fp16 takes the bf16 rows. See sweep.json.
    ("row", "sm90", "bf16", 32): dict(BLOCK_M=64, num_warps=4, num_stages=2, EVICT=True, WAVES=0),  # 262144x32: 3293 GB/s = 111% of copy, x1.09 vs any
    ("row", "sm90", "bf16", 128): dict(BLOCK_M=8, num_warps=1, num_stages=2, EVICT=True),  # H200 2026-11-26 (sweep_triton_softmax.py --shapes, results/sweeps/2026-11-26-h200-triton-softmax-short-rows.md): 65536x128 3784 GB/s = 90% of copy, x1.09 vs any (the H100's row above it: BLOCK_M=32, 8 warps, WAVES=0, 109%)
    ("row", "sm90", "bf16", 512): dict(BLOCK_M=1, num_warps=1, num_stages=2), # H200 2026-11-26 (results/sweeps/2026-11-26-h200-triton-softmax-512-class.md), % of copy at N = 512 / 337 / 159: 94 / 70 / 57 vs any's 86 / 46 / 32 (torch.softmax 65 / 53 / 47)
    ("row", "sm90", "bf16", 1024): dict(BLOCK_M=2, num_warps=4, num_stages=2, EVICT=True, WAVES=0),  # H200 2026-11-26 (sweep_triton_softmax.py --shapes, results/sweeps/2026-11-26-h200-triton-softmax-short-rows.md): 32768x1024 3986 GB/s = 95% of copy, x1.15 vs any (H100: BLOCK_M=4, 8 warps, WAVES=0, 97%)
    ("row", "sm90", "bf16", 2048): dict(BLOCK_M=2, num_warps=8, num_stages=2),  # = any
    ("row", "sm90", "bf16", 4096): dict(BLOCK_M=1, num_warps=8, num_stages=2, EVICT=True, WAVES=0),  # 8192x4096: 2858 GB/s = 96% of copy, x1.09 vs any
    ("row", "sm90", "bf16", 8192): dict(BLOCK_M=1, num_warps=16, num_stages=2),  # = any
    ("row", "sm90", "bf16", 16384): dict(BLOCK_M=1, num_warps=16, num_stages=2, EVICT=True, WAVES=0),  # 4096x16384: 2542 GB/s = 86% of copy, x1.10 vs any
    ("row", "sm90", "fp16", 32): dict(BLOCK_M=64, num_warps=4, num_stages=2, EVICT=True, WAVES=0),  # = bf16
    ("row", "sm90", "fp16", 128): dict(BLOCK_M=8, num_warps=1, num_stages=2, EVICT=True),  # = bf16
    ("row", "sm90", "fp16", 512): dict(BLOCK_M=1, num_warps=1, num_stages=2),  # = bf16
    ("row", "sm90", "fp16", 1024): dict(BLOCK_M=2, num_warps=4, num_stages=2, EVICT=True, WAVES=0),  # = bf16
    ("row", "sm90", "fp16", 2048): dict(BLOCK_M=2, num_warps=8, num_stages=2),  # = bf16
    ("row", "sm90", "fp16", 4096): dict(BLOCK_M=1, num_warps=8, num_stages=2, EVICT=True, WAVES=0),  # = bf16
    ("row", "sm90", "fp16", 8192): dict(BLOCK_M=1, num_warps=16, num_stages=2),  # = bf16
    ("row", "sm90", "fp16", 16384): dict(BLOCK_M=1, num_warps=16, num_stages=2, EVICT=True, WAVES=0),  # = bf16
    ("row", "sm90", "fp32", 32): dict(BLOCK_M=16, num_warps=2, num_stages=2, EVICT=True, WAVES=0),  # H200 2026-11-26 (sweep_triton_softmax.py --shapes, results/sweeps/2026-11-26-h200-triton-softmax-short-rows.md): 262144x32 3925 GB/s = 94% of copy, x1.27 vs any
    ("row", "sm90", "fp32", 128): dict(BLOCK_M=4, num_warps=2, num_stages=2, EVICT=True, WAVES=0),  # H200 2026-11-26 (sweep_triton_softmax.py --shapes, results/sweeps/2026-11-26-h200-triton-softmax-short-rows.md): 65536x128 3924 GB/s = 94% of copy, x1.17 vs any (92 -> fewer registers, 31% -> more occupancy: results/ncu)
    ("row", "sm90", "fp32", 512): dict(BLOCK_M=2, num_warps=1, num_stages=2), # H200 2026-11-26 (results/sweeps/2026-11-26-h200-triton-softmax-512-class.md), % of copy at N = 512 / 337 / 159: 93 / 82 / 81 vs any's 85 / 74 / 55 (torch.softmax 98 / 93 / 87)
    ("row", "sm90", "fp32", 1024): dict(BLOCK_M=1, num_warps=2, num_stages=2, EVICT=True, WAVES=0),  # H200 2026-11-26 (sweep_triton_softmax.py --shapes, results/sweeps/2026-11-26-h200-triton-softmax-short-rows.md): 32768x1024 4157 GB/s = 99% of copy, x1.16 vs any (H100: BLOCK_M=2, 100%)
    ("row", "sm90", "fp32", 2048): dict(BLOCK_M=2, num_warps=8, num_stages=2),  # = any
    ("row", "sm90", "fp32", 4096): dict(BLOCK_M=1, num_warps=4, num_stages=2, EVICT=True, WAVES=0),  # 8192x4096: 2964 GB/s = 100% of copy, x1.08 vs any
    ("row", "sm90", "fp32", 8192): dict(BLOCK_M=1, num_warps=16, num_stages=2),  # = any
    ("row", "sm90", "fp32", 16384): dict(BLOCK_M=1, num_warps=16, num_stages=2, WAVES=0),  # 4096x16384: 2625 GB/s = 88% of copy, x1.07 vs any
    ("online", "sm90", "bf16", 131072): dict(BLOCK_M=1, BLOCK_N=32768, BLOCK_N_STRIDED=2048, num_warps=16, num_stages=1, PROGRAMS_PER_SM=1, EVICT=True),  # 512x131072: 2507 GB/s = 84% of copy, x1.46 vs any
    ("online", "sm90", "fp16", 131072): dict(BLOCK_M=1, BLOCK_N=32768, BLOCK_N_STRIDED=2048, num_warps=16, num_stages=1, PROGRAMS_PER_SM=1, EVICT=True),  # = bf16
    # ("online", sm90, fp32, 131072): the sweep's pick (BLOCK_N=16384, 32 warps, 70% vs 57%) spills 8 bytes on a strided row; not the fp32 default there (the single pass is)
    ("split", "sm90", "bf16", 131072): dict(BLOCK_M=1, BLOCK_N=8192, BLOCK_N_STRIDED=2048, num_warps=8, num_stages=1, PROGRAMS_PER_SM=4, MIN_TILES=4, SINGLE_PASS=False),  # = any
    ("split", "sm90", "bf16", 1048576): dict(BLOCK_M=1, BLOCK_N=4096, BLOCK_N_STRIDED=2048, num_warps=4, num_stages=1, PROGRAMS_PER_SM=4, MIN_TILES=4, SINGLE_PASS=True),  # 64x1048576 single pass: 2045 GB/s = 69% of copy, x2.03 vs split on any
    ("split", "sm90", "bf16", 4194304): dict(BLOCK_M=1, BLOCK_N=4096, BLOCK_N_STRIDED=2048, num_warps=4, num_stages=1, PROGRAMS_PER_SM=8, MIN_TILES=4, SINGLE_PASS=True),  # 8x4194304 single pass: 1881 GB/s = 63% of copy, x2.65 vs split on any
    ("split", "sm90", "bf16", 33554432): dict(BLOCK_M=1, BLOCK_N=16384, BLOCK_N_STRIDED=2048, num_warps=16, num_stages=1, PROGRAMS_PER_SM=4, MIN_TILES=4, EVICT=True),  # 1x33554432: 1835 GB/s = 62% of copy, x1.03 vs any
    ("split", "sm90", "fp16", 131072): dict(BLOCK_M=1, BLOCK_N=8192, BLOCK_N_STRIDED=2048, num_warps=8, num_stages=1, PROGRAMS_PER_SM=4, MIN_TILES=4, SINGLE_PASS=False),  # = bf16
    ("split", "sm90", "fp16", 1048576): dict(BLOCK_M=1, BLOCK_N=4096, BLOCK_N_STRIDED=2048, num_warps=4, num_stages=1, PROGRAMS_PER_SM=4, MIN_TILES=4, SINGLE_PASS=True),  # = bf16
    ("split", "sm90", "fp16", 4194304): dict(BLOCK_M=1, BLOCK_N=4096, BLOCK_N_STRIDED=2048, num_warps=4, num_stages=1, PROGRAMS_PER_SM=8, MIN_TILES=4, SINGLE_PASS=True),  # = bf16
    ("split", "sm90", "fp16", 33554432): dict(BLOCK_M=1, BLOCK_N=16384, BLOCK_N_STRIDED=2048, num_warps=16, num_stages=1, PROGRAMS_PER_SM=4, MIN_TILES=4, EVICT=True),  # = bf16
    ("split", "sm90", "fp32", 131072): dict(_SPLIT_FP32, SINGLE_PASS=True),  # kept: the bench of 2026-11-22 measured this row (split_sync on its "any" row) at 89% of copy; the sweep's pick timed 82%
    ("split", "sm90", "fp32", 1048576): dict(BLOCK_M=1, BLOCK_N=4096, BLOCK_N_STRIDED=2048, num_warps=4, num_stages=1, PROGRAMS_PER_SM=8, MIN_TILES=4, SINGLE_PASS=True),  # 64x1048576 single pass: 2376 GB/s = 80% of copy, x1.59 vs split on any
    ("split", "sm90", "fp32", 4194304): dict(BLOCK_M=1, BLOCK_N=4096, BLOCK_N_STRIDED=2048, num_warps=4, num_stages=1, PROGRAMS_PER_SM=8, MIN_TILES=4, SINGLE_PASS=True),  # 8x4194304 single pass: 2182 GB/s = 73% of copy, x1.42 vs split on any
    ("split_sync", "sm90", "bf16", 131072): dict(BLOCK_N=8192, BLOCK_N_STRIDED=2048, num_warps=8, num_stages=1, maxnreg=80, CHUNK_TILES=1, MAX_SPIN=65536),  # = any: the 1048576 row below (4 warps, 2-tile chunks) made the single pass fall back at 900x16389 on the H100 (tests/test_softmax.py::test_triton_split_single_pass)
    ("split_sync", "sm90", "bf16", 1048576): dict(BLOCK_N=4096, BLOCK_N_STRIDED=2048, num_warps=4, num_stages=1, CHUNK_TILES=2, MAX_SPIN=65536),  # 64x1048576 single pass: 2045 GB/s = 69% of copy, x2.03 vs split on any
    ("split_sync", "sm90", "bf16", 4194304): dict(BLOCK_N=4096, BLOCK_N_STRIDED=2048, num_warps=4, num_stages=1, CHUNK_TILES=1, MAX_SPIN=65536, PREFETCH=True),  # 8x4194304 single pass: 1881 GB/s = 63% of copy, x2.65 vs split on any
    ("split_sync", "sm90", "fp16", 131072): dict(BLOCK_N=8192, BLOCK_N_STRIDED=2048, num_warps=8, num_stages=1, maxnreg=80, CHUNK_TILES=1, MAX_SPIN=65536),  # = any: the 1048576 row below (4 warps, 2-tile chunks) made the single pass fall back at 900x16389 on the H100 (tests/test_softmax.py::test_triton_split_single_pass)
    ("split_sync", "sm90", "fp16", 1048576): dict(BLOCK_N=4096, BLOCK_N_STRIDED=2048, num_warps=4, num_stages=1, CHUNK_TILES=2, MAX_SPIN=65536),  # = bf16
    ("split_sync", "sm90", "fp16", 4194304): dict(BLOCK_N=4096, BLOCK_N_STRIDED=2048, num_warps=4, num_stages=1, CHUNK_TILES=1, MAX_SPIN=65536, PREFETCH=True),  # = bf16
    ("split_sync", "sm90", "fp32", 131072): dict(BLOCK_N=8192, BLOCK_N_STRIDED=2048, num_warps=8, num_stages=1, maxnreg=80, CHUNK_TILES=1, MAX_SPIN=65536),  # = any (kept with the split row above)
    ("split_sync", "sm90", "fp32", 1048576): dict(BLOCK_N=8192, BLOCK_N_STRIDED=2048, num_warps=8, num_stages=1, CHUNK_TILES=1, MAX_SPIN=65536, PREFETCH=True),  # 64x1048576 single pass: 2376 GB/s = 80% of copy, x1.59 vs split on any
    ("split_sync", "sm90", "fp32", 4194304): dict(BLOCK_N=8192, BLOCK_N_STRIDED=2048, num_warps=8, num_stages=1, maxnreg=80, CHUNK_TILES=1, MAX_SPIN=65536, EVICT=True),  # 8x4194304 single pass: 2182 GB/s = 73% of copy, x1.42 vs split on any
    # ---- sweep_triton_softmax.py --apply (end)
    ("split", "sm90", "fp32", _INF): dict(_SPLIT_FP32, SINGLE_PASS=True),
    ("split", "sm90", "any", _INF): dict(_SPLIT_ANY, SINGLE_PASS=True),
})

# The default kernel (kernel=None) per (arch, dtype): "row" while N <= row_max_n (fits in
# registers; "backward_row" while N <= backward_row_max_n, two tensors on chip), else "split" when
# M < split_rows_per_sm × SMs (too few rows to give every SM work) or the "split" row of N's size
# class sets SINGLE_PASS, else "online". The H100 guess: rows up to 32K columns fit one program's
# registers without spilling (see above; 16K for the backward, which holds y and dy); fewer than 2
# rows per SM leaves SMs idle. "cpu" (interpreter) uses a small row limit and a pretend SM count so
# CI exercises every default path at small sizes.
TRITON_SOFTMAX_DEFAULT: dict = _Table({
    ("any", "any"): dict(row_max_n=32768, backward_row_max_n=16384, split_rows_per_sm=2),
    ("cpu", "any"): dict(row_max_n=1024, backward_row_max_n=1024, split_rows_per_sm=2, sm_count=4),
})


# Row lengths N (inclusive ranges) per (arch, dtype) where the row kernel reads rows that start off
# the 16-byte grid (N·size not a multiple of 16) through aligned windows, 16-byte packs
# (softmax_row.py WIN; tiled_attn/triton/softmax.py _win); elsewhere it reads them one element at a
# time. Measured on the H100, 2026-11-27 (benchmarks/probe_softmax_window.py, results/
# 2026-11-27-h100-probe-softmax-window.txt: the same plan with and without, eager, 3 rounds):
# fp32 N <= 64 1179602x23 1.65x (48 -> 80% of copy), 1698226x25 1.51x, 694789x13 and 301809x37
# 1.23x, 2299375x61 1.20x (3666424x18 0.91x and 250635x42 0.92x the losses); fp32 N > 16384
# 2880x24851 1.16x (78 -> 90%); 16-bit N 33-128 1.00-1.23x (250635x42 1.23x, 301809x37 1.19x).
# Not elsewhere: the window's masks and edge packs cost more than the packs save on mid-length
# rows (bf16 185327x681 0.60x, 19041x8996 0.58x; fp32 N 65-128 0.79-0.82x, 3552x11430 0.81x).
# fp32 N > 16384 is left out although it measured faster: those rows take the "any" 32768 class
# (32 warps, so at most 64 registers a thread), whose window build spills 16 bytes (32 with LOG)
# on sm_90a, and the shipped builds do not spill (tests/test_softmax.py).
TRITON_SOFTMAX_WINDOW: dict = _Table({
    ("sm90", "fp32"): ((1, 64),),
    ("sm90", "bf16"): ((33, 128),),
    ("sm90", "fp16"): ((33, 128),),
})


def triton_softmax_window(arch_: str, dtype: str, n: int) -> bool:
    """Whether TRITON_SOFTMAX_WINDOW turns the row kernel's window reads on for rows of n columns."""
    return any(lo <= n <= hi for lo, hi in TRITON_SOFTMAX_WINDOW.get((base_arch(arch_), dtype), ()))


# [keys it was built from, {(kernel, arch, dtype): sorted size-class bounds}]
_TRITON_SOFTMAX_INDEX: list = [frozenset(), {}]


def _triton_softmax_index() -> dict:
    # Rebuilt whenever rows are added or removed (a tuning sweep, a test); a changed row is read
    # from the table itself at each lookup. Costs a few µs per launch, not a scan of the table.
    if TRITON_SOFTMAX.keys() != _TRITON_SOFTMAX_INDEX[0]:
        index: dict = {}
        for key in TRITON_SOFTMAX:
            index.setdefault(key[:3], []).append(key[3])
        _TRITON_SOFTMAX_INDEX[:] = [frozenset(TRITON_SOFTMAX),
                                    {k: sorted(v) for k, v in index.items()}]
    return _TRITON_SOFTMAX_INDEX[1]


def triton_softmax_config(kernel: str, arch_: str, dtype: str, n: int) -> dict:
    """The TRITON_SOFTMAX row for a row of `n` columns: from the most specific (arch, dtype) table
    of `kernel` that covers n; KeyError when none does."""
    index = _triton_softmax_index()
    largest = None
    for a in dict.fromkeys((arch_, "any")):
        for d in dict.fromkeys((dtype, "any")):
            bounds = index.get((kernel, a, d))
            if not bounds:
                continue
            if n <= bounds[-1]:
                return TRITON_SOFTMAX[(kernel, a, d, bounds[bisect.bisect_left(bounds, n)])]
            largest = largest or (a, d, bounds[-1])
    if largest:
        a, d, bound = largest
        raise KeyError(f"{kernel!r} has no launch config for rows of {n} columns "
                       f"(at most {bound} on {a}/{d})")
    raise KeyError(f"no launch config for {kernel!r} on {arch_}/{dtype}: add a row to TRITON_SOFTMAX")


def triton_softmax_default(arch_: str, dtype: str) -> dict:
    """The TRITON_SOFTMAX_DEFAULT thresholds for (arch, dtype), falling back to 'any'."""
    for a in dict.fromkeys((arch_, "any")):
        for d in dict.fromkeys((dtype, "any")):
            if (a, d) in TRITON_SOFTMAX_DEFAULT:
                return TRITON_SOFTMAX_DEFAULT[(a, d)]
    raise KeyError(f"no default-kernel rule for {arch_}/{dtype}: add a row to TRITON_SOFTMAX_DEFAULT")

# ---------------------------------------------------------------------------------------------
# CUDA softmax ladder (csrc/softmax/, tiled_attn/cuda/) — owned by that module's author.
# ---------------------------------------------------------------------------------------------
# Key: (kernel, arch, dtype, size class), read by cuda_softmax_config: the size class is an upper
# bound on N (the row length) and a row takes the smallest class >= N; arch and dtype fall back to
# "any". kernel: a ladder name (csrc/softmax/<name>.cu), "default" (what kernel=None runs) or
# "backward" (the fused backward, csrc/softmax/backward.cu).
# Fields: threads = threads per block (warp_row / tile2d / the backward's short rows: 32 × rows per
# block; block_row_reg grows it to cover the row; block_smem_tree needs a power of two);
# block_row_smem: cluster = fewest CTAs per row, cta_bytes = most row bytes one CTA caches before
# the row spreads over a larger cluster (0: all its shared memory); split_row / backward: chunk =
# most columns per block, but a row is cut into more chunks (down to min_chunk columns) until there
# are blocks_per_sm × SMs blocks. "default" rows: kernel, and for few_rows > M the few_rows_kernel.
#
# The "any" rows were reasoned H100 guesses; checked against the benchmark of 2026-11-22
# (benchmarks/results/2026-11-22-nvidia-h100-80gb-hbm3-softmax_softmax_backward_decode.md): at every
# ladder shape the default is the fastest rung, within 2% (8192x4096 fp32: block_row_reg 97% of copy,
# block_row_smem 99%). The reasoning:
# * N <= 1024: a warp per row in registers (warp_row): no barrier, 1 read + 1 write; 4 warps a
#   block. At most 32 cached values a lane (63 registers fp32, 80 bf16 on sm_90a): 6-8 blocks,
#   24-32 warps an SM, each lane with 4-8 16-byte loads in flight. Caching 2048 columns took 64
#   floats a lane at ~200 registers, 2 blocks an SM, nothing to overlap one warp's reduction with
#   another's loads: past 1024 warp_row now streams, and the default is block_row_reg.
# * N <= 8192: a block per row in registers (block_row_reg), 256 threads × 8 (N ~ 1K-2K) to 32
#   (8K) cached floats, at most 64 registers (its __launch_bounds__).
# * N <= 256K: the row in shared memory (block_row_smem); 64 KB per CTA keeps 3 CTAs an SM (228 KB)
#   so one CTA's reduction overlaps another's loads; longer rows spread over a cluster (sm_90).
#   Fewer than 64 rows leave SMs idle (64 × a few CTAs < 132 SMs × 3): split_row instead.
# * longer rows: split_row, chunks of 32K columns (128 KB fp32), >= 4 blocks an SM in all.
# * the backward: warp-cached up to 1024 columns, then a block per row whose re-read hits L1/L2,
#   split past 16K columns.
_CUDA_ANY_N = float("inf")
CUDA_SOFTMAX: dict = _Table({
    ("default", "any", "any", 1024): dict(kernel="warp_row"),
    ("default", "any", "any", 8192): dict(kernel="block_row_reg"),
    ("default", "any", "any", 262144): dict(kernel="block_row_smem", few_rows=64,
                                            few_rows_kernel="split_row"),
    ("default", "any", "any", _CUDA_ANY_N): dict(kernel="split_row"),
    # the ladder's baselines: one block size for all lengths
    ("naive", "any", "any", _CUDA_ANY_N): dict(threads=128),
    ("online_thread", "any", "any", _CUDA_ANY_N): dict(threads=128),
    ("block_smem_tree", "any", "any", 1024): dict(threads=128),
    ("block_smem_tree", "any", "any", _CUDA_ANY_N): dict(threads=512),
    ("block_shuffle", "any", "any", 1024): dict(threads=128),
    ("block_shuffle", "any", "any", _CUDA_ANY_N): dict(threads=512),
    ("tile2d", "any", "any", _CUDA_ANY_N): dict(threads=128),
    # flat_rows: cta_bytes = most span bytes a block stages (0: 48 KB); rows past 2048 columns are
    # refused by the kernel's own limit (softmax_max_cols), not by a size class here.
    ("flat_rows", "any", "any", _CUDA_ANY_N): dict(threads=128, cta_bytes=8192),
    # the fast rungs
    ("warp_row", "any", "any", _CUDA_ANY_N): dict(threads=128),
    ("block_row_reg", "any", "any", _CUDA_ANY_N): dict(threads=256),
    ("block_row_smem", "any", "any", 8192): dict(threads=256, cluster=1, cta_bytes=0),
    ("block_row_smem", "any", "any", _CUDA_ANY_N): dict(threads=512, cluster=1, cta_bytes=65536),
    ("split_row", "any", "any", _CUDA_ANY_N): dict(threads=256, chunk=32768, min_chunk=4096,
                                                   blocks_per_sm=4),
    ("backward", "any", "any", 1024): dict(threads=128, chunk=16384, min_chunk=4096,
                                           blocks_per_sm=4),
    ("backward", "any", "any", _CUDA_ANY_N): dict(threads=256, chunk=16384, min_chunk=4096,
                                                  blocks_per_sm=4),
    # sm90: benchmarks/sweep_cuda_softmax.py on the H100 (2026-11-22, copy 2970 GB/s; after the
    # 16-byte pack stores), % of copy against the "any" row, where the gain beat the sweep's noise
    # (~3%: the same config timed twice differed by up to 3.5 points): block_row_reg at 128 threads
    # (more CTAs an SM) bf16 8192x4096 89 vs 82, 4096x16384 83 vs 80; block_row_smem bf16 with
    # 256 threads and 32 KB / 112 KB a CTA 4096x16384 88 vs 79, 512x131072 67 vs 61; split_row fp32
    # in 16K-column chunks of 512 threads 65-67 vs 61-64 at all four long shapes (bf16: no gain).
    ("block_row_reg", "sm90", "any", _CUDA_ANY_N): dict(threads=128),
    ("block_row_smem", "sm90", "bf16", 16384): dict(threads=256, cluster=1, cta_bytes=32768),
    ("block_row_smem", "sm90", "bf16", _CUDA_ANY_N): dict(threads=256, cluster=1, cta_bytes=114688),
    ("split_row", "sm90", "fp32", _CUDA_ANY_N): dict(threads=512, chunk=16384, min_chunk=4096,
                                                    blocks_per_sm=4),
    # flat_rows, H200 (2026-11-26, sweep_cuda_softmax.py --kernels flat_rows on 14 odd shapes x
    # fp32/bf16, benchmarks/results/sweeps/2026-11-26-h200-cuda-softmax-flat-rows.md): small spans
    # win (more tiles in flight; a 48 KB span left 159619x17 with 212 tiles for 132 SMs): 128 threads
    # and 4 KB at N <= 40 reach 0.96x of each shape's best config on average (min 0.89), 8 KB
    # (the "any" row) 0.96x (min 0.92) up to 128 columns; 16 KB and 48 KB 0.84x and 0.45x at N <= 40.
    ("flat_rows", "sm90", "any", 40): dict(threads=128, cta_bytes=4096),
    ("flat_rows", "sm90", "any", _CUDA_ANY_N): dict(threads=128, cta_bytes=8192),
})


def cuda_softmax_config(kernel: str, arch_: str, dtype: str, n: int) -> dict:
    """The CUDA_SOFTMAX row of `kernel` for a row of `n` columns; KeyError when none covers it."""
    for a in dict.fromkeys((arch_, "any")):
        for d in dict.fromkeys((dtype, "any")):
            bounds = [k[3] for k in CUDA_SOFTMAX if k[:3] == (kernel, a, d)]
            if bounds:
                fits = [b for b in bounds if n <= b]
                if not fits:
                    raise KeyError(f"CUDA softmax {kernel!r} has no launch config for rows of {n} "
                                   f"columns (at most {max(bounds)} on {a}/{d})")
                return CUDA_SOFTMAX[(kernel, a, d, min(fits))]
    raise KeyError(f"no launch config for CUDA softmax {kernel!r} on {arch_}/{dtype}: add a row to "
                   "CUDA_SOFTMAX in tiled_attn/configs.py")

# ---------------------------------------------------------------------------------------------
# Softmax backend and kernel for backend=None on CUDA (tiled_attn/softmax_select.py, issue 16).
# ---------------------------------------------------------------------------------------------
# Key: (arch, dtype, layout, pool); arch "sm90" or a GPU model's "sm90:h200" (configs.model_arch:
# a model's rows come first, its arch's rows for a key it lacks); layout "contig" (unit column
# stride) or "strided"; pool "all" (the CUDA extension can be used) or "triton" (it cannot, or
# log_softmax, which it lacks).
# Value: rows (n_max, m_min, backend, kernel), read in order: the first with N <= n_max and
# M >= m_min gives the (backend, kernel). A key without rows, or an N past its last row, keeps
# the choice made before this table (DEFAULT_BACKEND, then that backend's own kernel rule).
# Written by `python benchmarks/sweep_softmax_random.py --apply SWEEP_JSON` from eager timings of
# every kernel over issue 16's random shapes (the figures are in benchmarks/results/).
# The sweep's shapes hold M·N >= 2^20 elements (issue 16): below SOFTMAX_SELECT_MIN_ELEMS the rows
# speak for no measured size and the old choice stands. There a call is host-bound, and the Triton
# launch costs the host less than the CUDA extension's binding (H200, 2026-11-26, 4x128 fp32: 14.1
# vs 15.4 µs a call; the table's row for it had picked the extension).
SOFTMAX_SELECT_MIN_ELEMS = 1 << 20
SOFTMAX_SELECT: dict = _Table({
    # ---- sweep_softmax_random.py --apply sm90:h200 (begin): 2026-11-26, NVIDIA H200, copy 4151 GB/s.
    # 64 shapes x fp32,bf16,fp16, eager; each row: its shapes' time vs the fastest kernel's, and vs torch.softmax.
    # Held-out (96 cases): default vs torch.softmax min 0.81x, median 1.28x, 27 below 1.0x; vs the fastest contender min 0.53x, median 1.00x; on chip and >= 64 MB: 6/28 at >= 90% of copy
    ("sm90:h200", "bf16", "contig", "all"): (
        (16, 1, "triton", None),  # 11 shapes: 0.99-1.00x the fastest, 0.84-2.38x torch
        (82, 275034, "cuda", "flat_rows"),  # 5 shapes: 1.00-1.00x the fastest, 1.16-2.05x torch
        (82, 1, "triton", "row"),  # 3 shapes: 1.00-1.00x the fastest, 0.74-1.24x torch
        (32768, 1, "triton", None),  # 23 shapes: 0.91-1.00x the fastest, 0.77-3.77x torch
        (262144, 205, "triton", "split"),  # 4 shapes: 1.00-1.00x the fastest, 0.81-0.96x torch
        (262144, 1, "triton", "online"),  # 1 shape: 1.00-1.00x the fastest, 0.77-0.77x torch
        (2097152, 64, "triton", None),  # 2 shapes: 1.00-1.00x the fastest, 0.87-1.38x torch
        (2097152, 1, "cuda", None),  # 8 shapes: 0.97-1.00x the fastest, 1.76-10.42x torch
        (4194304, 1, "triton", "split"),  # 2 shapes: 1.00-1.00x the fastest, 9.01-15.69x torch
        (33554432, 1, "cuda", None),  # 5 shapes: 0.96-1.00x the fastest, 8.58-43.05x torch
    ),
    ("sm90:h200", "bf16", "contig", "triton"): (
        (32768, 1, "triton", None),  # 42 shapes: 0.96-1.00x the fastest, 0.73-3.77x torch
        (262144, 205, "triton", "split"),  # 4 shapes: 1.00-1.00x the fastest, 0.81-0.96x torch
        (262144, 1, "triton", "online"),  # 1 shape: 1.00-1.00x the fastest, 0.77-0.77x torch
        (33554432, 12, "triton", None),  # 8 shapes: 0.99-1.00x the fastest, 0.87-3.30x torch
        (33554432, 1, "triton", "split"),  # 9 shapes: 1.00-1.00x the fastest, 1.88-44.78x torch
    ),
    ("sm90:h200", "fp16", "contig", "all"): (
        (10, 1, "triton", "row"),  # 8 shapes: 0.99-1.00x the fastest, 0.60-2.37x torch
        (16, 469144, "triton", "row"),  # 2 shapes: 1.00-1.00x the fastest, 0.94-2.09x torch
        (16, 1, "cuda", "flat_rows"),  # 1 shape: 1.00-1.00x the fastest, 0.84-0.84x torch
        (82, 275034, "cuda", "flat_rows"),  # 5 shapes: 1.00-1.00x the fastest, 1.16-2.05x torch
        (82, 1, "triton", "row"),  # 3 shapes: 0.97-1.00x the fastest, 0.82-1.27x torch
        (211, 15155, "triton", "row"),  # 5 shapes: 0.98-1.00x the fastest, 0.86-1.97x torch
        (211, 1, "cuda", "warp_row"),  # 1 shape: 1.00-1.00x the fastest, 0.81-0.81x torch
        (256, 1, "cuda", None),  # 1 shape: 1.00-1.00x the fastest, 0.82-0.82x torch
        (32768, 1, "triton", None),  # 16 shapes: 0.93-1.00x the fastest, 0.83-3.81x torch
        (262144, 205, "triton", "split"),  # 4 shapes: 1.00-1.00x the fastest, 0.79-0.95x torch
        (262144, 1, "triton", "online"),  # 1 shape: 1.00-1.00x the fastest, 0.88-0.88x torch
        (1517788, 112, "triton", None),  # 1 shape: 1.00-1.00x the fastest, 0.86-0.86x torch
        (1517788, 1, "cuda", None),  # 8 shapes: 0.90-1.00x the fastest, 1.75-10.18x torch
        (4194304, 1, "triton", None),  # 3 shapes: 0.99-1.00x the fastest, 1.37-15.16x torch
        (33554432, 1, "cuda", None),  # 5 shapes: 0.95-1.00x the fastest, 8.47-42.29x torch
    ),
    ("sm90:h200", "fp16", "contig", "triton"): (
        (53, 1, "triton", "row"),  # 16 shapes: 0.97-1.00x the fastest, 0.60-2.37x torch
        (32768, 1, "triton", None),  # 26 shapes: 0.93-1.00x the fastest, 0.51-3.81x torch
        (343799, 205, "triton", "split"),  # 4 shapes: 1.00-1.00x the fastest, 0.79-0.95x torch
        (343799, 1, "triton", "online"),  # 2 shapes: 1.00-1.00x the fastest, 0.88-1.57x torch
        (33554432, 1, "triton", None),  # 16 shapes: 0.95-1.00x the fastest, 0.86-44.36x torch
    ),
    ("sm90:h200", "fp32", "contig", "all"): (
        (6, 12150995, "cuda", "online_thread"),  # 1 shape: 1.00-1.00x the fastest, 0.79-0.79x torch
        (6, 1, "triton", None),  # 4 shapes: 0.98-1.00x the fastest, 0.84-1.31x torch
        (7, 1, "cuda", "flat_rows"),  # 1 shape: 1.00-1.00x the fastest, 1.00-1.00x torch
        (16, 1, "triton", None),  # 5 shapes: 0.98-1.00x the fastest, 0.81-1.46x torch
        (85, 71262, "cuda", "flat_rows"),  # 7 shapes: 1.00-1.00x the fastest, 0.79-1.45x torch
        (85, 1, "triton", "row"),  # 2 shapes: 1.00-1.00x the fastest, 0.86-0.87x torch
        (32768, 1, "triton", None),  # 22 shapes: 0.90-1.00x the fastest, 0.79-1.99x torch
        (33554432, 18, "cuda", None),  # 11 shapes: 0.92-1.00x the fastest, 0.86-4.30x torch
        (33554432, 1, "cuda", "split_row"),  # 11 shapes: 0.95-1.00x the fastest, 3.57-51.43x torch
    ),
    ("sm90:h200", "fp32", "contig", "triton"): (
        (32768, 1, "triton", None),  # 42 shapes: 0.93-1.00x the fastest, 0.60-1.99x torch
        (33554432, 64, "triton", "online"),  # 7 shapes: 0.97-1.00x the fastest, 0.78-1.14x torch
        (33554432, 1, "triton", None),  # 15 shapes: 0.95-1.00x the fastest, 1.26-40.72x torch
    ),
    # ---- sweep_softmax_random.py --apply sm90:h200 (end)
    # ---- sweep_softmax_random.py --apply sm90:h100 (begin): 2026-11-27, NVIDIA H100 80GB HBM3, copy 2965 GB/s.
    # 73 shapes x fp32,bf16,fp16, eager; each row: its shapes' time vs the fastest kernel's, and vs torch.softmax.
    # Held-out (96 cases): default vs torch.softmax min 0.82x, median 1.24x, 18 below 1.0x; vs the fastest contender min 0.66x, median 1.00x; on chip and >= 64 MB: 14/28 at >= 90% of copy
    ("sm90:h100", "bf16", "contig", "all"): (
        (16, 1, "triton", None),  # 10 shapes: 0.97-1.00x the fastest, 0.78-1.92x torch
        (733, 1134115, "cuda", "flat_rows"),  # 4 shapes: 1.00-1.00x the fastest, 1.12-1.78x torch
        (733, 1, "triton", None),  # 13 shapes: 0.96-1.00x the fastest, 0.94-1.36x torch
        (1024, 1, "cuda", "warp_row"),  # 1 shape: 1.00-1.00x the fastest, 1.20-1.20x torch
        (32768, 1, "triton", None),  # 9 shapes: 0.98-1.00x the fastest, 1.00-2.78x torch
        (262144, 205, "triton", "split"),  # 3 shapes: 0.95-1.00x the fastest, 0.75-0.98x torch
        (262144, 1, "triton", "online"),  # 1 shape: 1.00-1.00x the fastest, 0.90-0.90x torch
        (343799, 1, "cuda", "block_row_smem"),  # 1 shape: 1.00-1.00x the fastest, 2.62-2.62x torch
        (1517788, 111, "triton", None),  # 1 shape: 1.00-1.00x the fastest, 1.05-1.05x torch
        (1517788, 1, "cuda", None),  # 6 shapes: 0.97-1.00x the fastest, 1.62-10.23x torch
        (4194304, 1, "triton", None),  # 3 shapes: 1.00-1.00x the fastest, 1.31-13.47x torch
        (33554432, 1, "cuda", None),  # 5 shapes: 1.00-1.00x the fastest, 7.33-38.88x torch
    ),
    ("sm90:h100", "bf16", "contig", "triton"): (
        (32768, 1, "triton", None),  # 37 shapes: 0.96-1.00x the fastest, 0.78-2.78x torch
        (343799, 205, "triton", "split"),  # 3 shapes: 1.00-1.00x the fastest, 0.75-0.98x torch
        (343799, 1, "triton", "online"),  # 2 shapes: 1.00-1.00x the fastest, 0.90-1.49x torch
        (33554432, 1, "triton", None),  # 15 shapes: 1.00-1.00x the fastest, 1.05-38.89x torch
    ),
    ("sm90:h100", "fp16", "contig", "all"): (
        (10, 1, "triton", "row"),  # 7 shapes: 0.98-1.00x the fastest, 0.72-1.23x torch
        (13, 1, "cuda", "flat_rows"),  # 2 shapes: 1.00-1.00x the fastest, 1.14-1.38x torch
        (16, 1, "triton", None),  # 1 shape: 1.00-1.00x the fastest, 1.93-1.93x torch
        (370, 1134115, "cuda", "flat_rows"),  # 4 shapes: 1.00-1.00x the fastest, 1.12-1.77x torch
        (370, 1, "triton", None),  # 11 shapes: 0.99-1.00x the fastest, 0.99-1.55x torch
        (512, 1, "triton", "row"),  # 1 shape: 1.00-1.00x the fastest, 1.14-1.14x torch
        (32768, 1, "triton", None),  # 11 shapes: 0.96-1.00x the fastest, 1.01-2.77x torch
        (262144, 205, "triton", "split"),  # 3 shapes: 1.00-1.00x the fastest, 0.74-0.98x torch
        (262144, 1, "triton", "online"),  # 1 shape: 1.00-1.00x the fastest, 0.88-0.88x torch
        (524288, 1, "cuda", "block_row_smem"),  # 2 shapes: 1.00-1.00x the fastest, 2.66-3.22x torch
        (1517788, 111, "triton", None),  # 1 shape: 1.00-1.00x the fastest, 1.04-1.04x torch
        (1517788, 1, "cuda", None),  # 5 shapes: 1.00-1.00x the fastest, 1.61-9.75x torch
        (4194304, 1, "triton", None),  # 3 shapes: 1.00-1.00x the fastest, 1.30-13.30x torch
        (33554432, 1, "cuda", None),  # 5 shapes: 1.00-1.00x the fastest, 7.24-38.34x torch
    ),
    ("sm90:h100", "fp16", "contig", "triton"): (
        (12, 1, "triton", "row"),  # 8 shapes: 0.98-1.00x the fastest, 0.72-1.23x torch
        (370, 1, "triton", None),  # 17 shapes: 1.00-1.00x the fastest, 0.99-1.93x torch
        (512, 1, "triton", "row"),  # 1 shape: 1.00-1.00x the fastest, 1.14-1.14x torch
        (32768, 1, "triton", None),  # 11 shapes: 1.00-1.00x the fastest, 1.01-2.77x torch
        (262144, 205, "triton", "split"),  # 3 shapes: 1.00-1.00x the fastest, 0.74-0.98x torch
        (262144, 1, "triton", "online"),  # 1 shape: 1.00-1.00x the fastest, 0.88-0.88x torch
        (33554432, 1, "triton", None),  # 16 shapes: 0.95-1.00x the fastest, 1.04-38.45x torch
    ),
    ("sm90:h100", "fp32", "contig", "all"): (
        (6, 10557851, "cuda", "online_thread"),  # 1 shape: 1.00-1.00x the fastest, 0.81-0.81x torch
        (6, 1, "triton", "row"),  # 3 shapes: 1.00-1.00x the fastest, 1.00-1.19x torch
        (8, 1, "cuda", "flat_rows"),  # 2 shapes: 1.00-1.00x the fastest, 0.87-1.25x torch
        (16, 1, "triton", None),  # 4 shapes: 0.97-1.00x the fastest, 1.04-1.30x torch
        (64, 71262, "cuda", "flat_rows"),  # 6 shapes: 1.00-1.00x the fastest, 0.89-1.20x torch
        (64, 1, "triton", None),  # 1 shape: 1.00-1.00x the fastest, 0.90-0.90x torch
        (128, 1, "triton", None),  # 4 shapes: 1.00-1.00x the fastest, 0.86-1.00x torch
        (1288, 30873, "cuda", None),  # 2 shapes: 1.00-1.00x the fastest, 1.00-1.01x torch
        (1288, 1, "triton", "row"),  # 7 shapes: 0.96-1.00x the fastest, 0.96-1.06x torch
        (32768, 1, "triton", None),  # 7 shapes: 0.91-1.00x the fastest, 0.94-1.56x torch
        (33554432, 1, "cuda", None),  # 20 shapes: 0.78-1.00x the fastest, 1.01-41.07x torch
    ),
    ("sm90:h100", "fp32", "contig", "triton"): (
        (32768, 8719, "triton", None),  # 31 shapes: 0.96-1.00x the fastest, 0.68-1.56x torch
        (32768, 1, "triton", "row"),  # 6 shapes: 0.99-1.00x the fastest, 0.96-1.43x torch
        (262144, 1, "triton", "online"),  # 4 shapes: 1.00-1.00x the fastest, 0.96-1.27x torch
        (33554432, 1, "triton", None),  # 16 shapes: 0.93-1.00x the fastest, 0.89-29.14x torch
    ),
    # ---- sweep_softmax_random.py --apply sm90:h100 (end)
    # ---- sweep_softmax_random.py --apply (begin): 2026-11-24, NVIDIA H100 80GB HBM3, copy 2971 GB/s.
    # 64 shapes x fp32,bf16,fp16, eager; each row: its shapes' time vs the fastest kernel's, and vs torch.softmax.
    # Held-out (96 cases): default vs torch.softmax min 0.39x, median 1.05x, 43 below 1.0x; vs the fastest contender min 0.31x, median 1.00x; on chip and >= 64 MB: 6/28 at >= 90% of copy
    ("sm90", "bf16", "contig", "all"): (
        (1, 1, "cuda", "online_thread"),  # 1 shape: 1.00-1.00x the fastest, 0.54-0.54x torch
        (32, 1, "triton", "row"),  # 12 shapes: 0.96-1.00x the fastest, 0.53-2.92x torch
        (128, 37783, "cuda", "warp_row"),  # 8 shapes: 0.99-1.00x the fastest, 0.60-0.93x torch
        (128, 1, "triton", "row"),  # 1 shape: 1.00-1.00x the fastest, 0.86-0.86x torch
        (211, 15155, "triton", "row"),  # 2 shapes: 1.00-1.00x the fastest, 0.79-1.10x torch
        (211, 1, "triton", None),  # 1 shape: 1.00-1.00x the fastest, 0.86-0.86x torch
        (256, 1, "cuda", None),  # 1 shape: 1.00-1.00x the fastest, 0.89-0.89x torch
        (3029, 6462, "triton", None),  # 7 shapes: 0.86-1.00x the fastest, 0.79-1.53x torch
        (3029, 1, "cuda", "block_row_reg"),  # 2 shapes: 1.00-1.00x the fastest, 0.66-0.94x torch
        (8192, 1, "triton", None),  # 5 shapes: 1.00-1.00x the fastest, 1.58-2.80x torch
        (45785, 1202, "cuda", None),  # 2 shapes: 1.00-1.00x the fastest, 1.32-1.68x torch
        (45785, 1, "cuda", "split_row"),  # 1 shape: 1.00-1.00x the fastest, 0.82-0.82x torch
        (65536, 1, "triton", "online"),  # 2 shapes: 0.92-1.00x the fastest, 0.69-0.78x torch
        (33554432, 64, "triton", None),  # 4 shapes: 0.86-1.00x the fastest, 0.84-1.31x torch
        (33554432, 1, "cuda", "split_row"),  # 15 shapes: 0.99-1.00x the fastest, 1.62-38.79x torch
    ),
    ("sm90", "bf16", "contig", "triton"): (
        (7, 1, "triton", None),  # 6 shapes: 1.00-1.00x the fastest, 0.38-2.98x torch
        (211, 15155, "triton", "row"),  # 18 shapes: 0.98-1.00x the fastest, 0.27-1.24x torch
        (211, 1, "triton", None),  # 1 shape: 1.00-1.00x the fastest, 0.86-0.86x torch
        (823158, 1189, "triton", None),  # 18 shapes: 0.86-1.00x the fastest, 0.62-2.80x torch
        (823158, 1, "triton", "online"),  # 7 shapes: 0.98-1.00x the fastest, 0.68-1.38x torch
        (878489, 1, "triton", None),  # 1 shape: 1.00-1.00x the fastest, 1.06-1.06x torch
        (1297960, 16, "triton", "online"),  # 3 shapes: 1.00-1.00x the fastest, 1.12-1.19x torch
        (1297960, 1, "triton", "split"),  # 1 shape: 1.00-1.00x the fastest, 1.28-1.28x torch
        (33554432, 1, "triton", None),  # 9 shapes: 0.99-1.00x the fastest, 1.17-39.19x torch
    ),
    ("sm90", "fp16", "contig", "all"): (
        (8, 6078686, "triton", None),  # 4 shapes: 1.00-1.00x the fastest, 0.54-1.14x torch
        (8, 1, "cuda", "online_thread"),  # 3 shapes: 0.97-1.00x the fastest, 0.49-0.82x torch
        (64, 1, "triton", None),  # 11 shapes: 0.98-1.00x the fastest, 0.59-1.24x torch
        (195, 16745, "cuda", "warp_row"),  # 5 shapes: 1.00-1.00x the fastest, 0.59-0.95x torch
        (195, 1, "triton", "row"),  # 1 shape: 1.00-1.00x the fastest, 0.82-0.82x torch
        (6515, 1080, "triton", None),  # 14 shapes: 0.83-1.00x the fastest, 0.68-2.11x torch
        (6515, 1, "cuda", "block_row_smem"),  # 1 shape: 1.00-1.00x the fastest, 1.22-1.22x torch
        (45785, 1, "cuda", None),  # 4 shapes: 0.99-1.00x the fastest, 0.86-2.92x torch
        (65536, 1, "triton", "online"),  # 2 shapes: 0.92-1.00x the fastest, 0.68-0.78x torch
        (33554432, 64, "triton", None),  # 4 shapes: 0.87-1.00x the fastest, 0.85-1.30x torch
        (33554432, 1, "cuda", None),  # 15 shapes: 0.98-1.00x the fastest, 1.62-38.12x torch
    ),
    ("sm90", "fp16", "contig", "triton"): (
        (8, 1, "triton", "row"),  # 7 shapes: 1.00-1.00x the fastest, 0.37-1.14x torch
        (1297960, 158, "triton", None),  # 40 shapes: 0.87-1.00x the fastest, 0.26-2.80x torch
        (1297960, 1, "triton", "online"),  # 8 shapes: 0.91-1.00x the fastest, 0.78-1.58x torch
        (33554432, 1, "triton", None),  # 9 shapes: 0.99-1.00x the fastest, 1.13-38.65x torch
    ),
    ("sm90", "fp32", "contig", "all"): (
        (10, 1, "triton", "row"),  # 8 shapes: 0.98-1.00x the fastest, 0.75-1.63x torch
        (16, 469144, "triton", "row"),  # 2 shapes: 1.00-1.00x the fastest, 0.56-0.75x torch
        (16, 1, "cuda", None),  # 1 shape: 1.00-1.00x the fastest, 0.73-0.73x torch
        (256, 64316, "cuda", None),  # 10 shapes: 0.96-1.00x the fastest, 0.48-0.99x torch
        (256, 1, "cuda", "warp_row"),  # 5 shapes: 0.94-1.00x the fastest, 0.64-1.01x torch
        (512, 1, "cuda", None),  # 2 shapes: 0.97-1.00x the fastest, 0.88-1.06x torch
        (4096, 1, "triton", None),  # 9 shapes: 0.96-1.00x the fastest, 0.86-1.36x torch
        (32768, 3558, "cuda", None),  # 3 shapes: 0.99-1.00x the fastest, 1.19-1.67x torch
        (32768, 1, "triton", None),  # 2 shapes: 1.00-1.00x the fastest, 1.06-1.41x torch
        (1048576, 18, "cuda", None),  # 8 shapes: 0.99-1.00x the fastest, 0.85-3.41x torch
        (1048576, 1, "cuda", "split_row"),  # 3 shapes: 1.00-1.00x the fastest, 2.44-5.45x torch
        (33554432, 1, "cuda", None),  # 11 shapes: 1.00-1.00x the fastest, 1.45-41.16x torch
    ),
    ("sm90", "fp32", "contig", "triton"): (
        (195, 1, "triton", "row"),  # 24 shapes: 0.97-1.00x the fastest, 0.34-1.63x torch
        (32768, 26954, "triton", None),  # 6 shapes: 1.00-1.00x the fastest, 0.61-1.51x torch
        (32768, 1, "triton", "row"),  # 12 shapes: 0.99-1.00x the fastest, 0.68-1.51x torch
        (524288, 1, "triton", "online"),  # 7 shapes: 1.00-1.00x the fastest, 0.86-1.27x torch
        (33554432, 7, "triton", None),  # 10 shapes: 0.87-1.00x the fastest, 0.89-7.05x torch
        (33554432, 1, "triton", "split"),  # 5 shapes: 1.00-1.00x the fastest, 2.63-29.05x torch
    ),
    # ---- sweep_softmax_random.py --apply (end)
})

# ---------------------------------------------------------------------------------------------
# Triton attention (tiled_attn/triton/attention.py) — owned by that module's author.
# ---------------------------------------------------------------------------------------------
# Key: (kernel, arch, dtype, D class, causal, size class); any of dtype, D class, causal and size
# class may be "*" (tiled_attn/triton/attention.py:config looks up the exact key first, then the
# wildcards, arch before "any"). kernel "fwd" (attention_fwd.py) or "decode" (attention_decode.py);
# D class "d64" (D <= 64), "d128" (D <= 128), "d256"; size class "short" (Nk <= 1024) or "long".
# fwd rows: BLOCK_M (query rows resident per program), BLOCK_N (keys per step), num_warps,
# num_stages, and the kernel-structure switches (TRITON_ATTENTION_DEFAULTS fills the ones a row
# leaves out; attention_fwd.py says what each does): FMA (scores kept raw, exp2 argument as one
# fused multiply-add; used only when scale > 0), LATE_L (row sum after the P·V product is issued),
# ADDR "ptr" | "offs" | "tma" (how K/V tiles are addressed; "tma" falls back to "offs" where TMA's
# alignment rules fail, and for float32). decode rows add the dispatch and split
# heuristics: max_rows, max_q (use the split-KV kernel when Nq·Hq/Hkv <= max_rows, or Nq <= max_q:
# with a big GQA group it then packs several row tiles, each still reading K/V once for its heads,
# where the forward kernel would read them once per query head), waves and min_split_keys (the
# split count: up to one program per SM with splits as short as a key tile, up to waves·SMs
# programs where a split still reads min_split_keys keys; tiled_attn/triton/attention.py:
# decode_splits says why and what was measured),
# merge_warps (the merge kernel, one program per query row). BLOCK_M of a decode row is the
# largest packed tile (the wrapper shrinks it to the next power of two >= 16 rows that holds Nq·G).
#
# The table is a _Table: a dict that counts its changes, so the wrapper's cached launch plans are
# rebuilt after any row is set, replaced or removed (replace rows; do not edit a row in place).
#
# The "any" rows are reasoned H100 guesses, not timings (2026-11, before the first sweep), checked
# only by compiling each for sm_90 offline (triton.compile, ptxas -v: no register spills, shared
# memory within 227 KB, wgmma + cp.async pipelining present; tests/test_attention.py::
# test_triton_attention_compiles_for_sm90a re-checks every sm90/"any" row and sweep candidate):
# D <= 64: 128x64 tiles at 4 warps (242 regs, 64 KB smem); D = 128: 8 warps for the 128-row fp32
# accumulator (222 regs, 128 KB smem); D = 256: 128x32 (236 regs, 128 KB) — 64x64 spills. float32
# runs the ieee dot on the FMA units, in SPLIT_D chunks of 16 head dims (attention_fwd.py), which
# hold whole operand rows and a [chunks, BLOCK_M, BLOCK_N] partial in registers: the largest tiles
# without spills (ptxas, 2026-11) are 32x16 at 8 warps for D <= 64 and 16x16 at 8 warps above
# (32x16 spills 12 bytes at D = 40 at 4 warps, 12-28 bytes at D = 128/224 at 8; 16x16 at 4 warps
# 4-16 bytes at D = 96). Decode: 4 warps,
# 64-key tiles (16-row packed tile: 128-168 regs, 70 KB of shared memory at 3 stages, so 3 programs
# fit an SM); D = 256 needs 8 warps for a 64-row packed tile.
# "cpu" rows are for the Triton interpreter (CI): small enough that the test shapes cross several
# tiles, the diagonal band and the ragged edges, large enough that the interpreter (~10 ms per key
# tile, measured) keeps the test file within minutes; tests/test_attention.py::test_tile_shapes
# covers 16-wide and unequal BLOCK_M/BLOCK_N tiles, test_kernel_variants every FMA/LATE_L/ADDR.


# Below this many matmul FLOPs (4·B·H·Nq·Nk·D, halved when causal) the attention kernels read K/V
# through pointers, not TMA descriptors: each call builds two descriptors on the host (~10 µs of
# host time, measured in the H100 profile of 2026-11-23: benchmarks/profile_host.py), and a kernel
# of fewer FLOPs (~30 µs at ~400 TFLOP/s) ends before the host is done with the next call, so the
# descriptors' cost would show in an eager call. Above it the host cost hides under the kernel.
TRITON_TMA_MIN_FLOPS = 1.2e10

# The kernel-structure fields a row may leave out: the first version's kernel.
TRITON_ATTENTION_DEFAULTS = {"FMA": False, "LATE_L": False, "ADDR": "ptr", "TWO_PARTS": False}
_DECODE_HEURISTICS = {"max_rows": 64, "max_q": 8, "waves": 2, "min_split_keys": 256, "merge_warps": 4}
_SM90_DECODE = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "max_rows": 64, "max_q": 8, "waves": 2, "min_split_keys": 512, "merge_warps": 4}
# The sm90 rows by (kernel, D class, causal, size class): bf16 and fp16 take the same row (the
# same tensor-core rate and tile sizes). Where they come from: the comment in TRITON_ATTENTION.
# TWO_PARTS (attention_fwd_d2_kernel: a head dim such as 96 or 192 as two power-of-two parts, not one
# padded tile) where it measured faster on the H100 (benchmarks/probe_two_parts.py, 2026-11-27,
# results/2026-11-27-h100-probe-two-parts.*; CUDA-graph time, two parts over one): D = 192 1.02-1.27x
# (causal 1.06-1.11x), D = 160 1.14-1.20x; D = 96 non-causal 1.00-1.10x, causal 1.07-1.11x at
# N <= 1024 but 0.93-0.97x above (D = 80 causal 0.94x), so the d128 causal long row keeps one
# tile; D = 48 0.98x / 1.04x (noise), so the d64 rows keep one tile.
_SM90_ROWS = {
    ("fwd", "d64", False, "short"): {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 4, "FMA": True, "LATE_L": True, "ADDR": "tma"},
    ("fwd", "d64", False, "long"): {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3, "FMA": True, "ADDR": "tma"},
    ("fwd", "d64", True, "short"): {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 4, "FMA": True, "ADDR": "tma"},
    ("fwd", "d64", True, "long"): {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 4, "FMA": True, "ADDR": "tma"},
    ("fwd", "d128", False, "short"): {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "FMA": True, "ADDR": "tma", "TWO_PARTS": True},
    ("fwd", "d128", False, "long"): {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3, "FMA": True, "ADDR": "tma", "TWO_PARTS": True},
    ("fwd", "d128", True, "short"): {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "FMA": True, "ADDR": "tma", "TWO_PARTS": True},
    ("fwd", "d128", True, "long"): {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3, "FMA": True, "LATE_L": True, "ADDR": "tma"},
    ("fwd", "d256", False, "short"): {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 8, "num_stages": 3, "TWO_PARTS": True},
    ("fwd", "d256", False, "long"): {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2, "FMA": True, "LATE_L": True, "ADDR": "tma", "TWO_PARTS": True},
    ("fwd", "d256", True, "short"): {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2, "FMA": True, "ADDR": "tma", "TWO_PARTS": True},
    ("fwd", "d256", True, "long"): {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2, "FMA": True, "ADDR": "tma", "TWO_PARTS": True},
    ("decode", "d128", "*", "*"): dict(_SM90_DECODE),
}
TRITON_ATTENTION: dict = _Table({
    # sm90 rows: measured on the H100 by benchmarks/tune_triton_attention.py (2026-11-22, bf16;
    # the winner per key by geometric-mean time over the benchmark grid's shapes, each candidate
    # first checked against SDPA). fp16 takes the bf16 rows: same tensor-core rate and tile sizes.
    # Re-run 2026-11-22 with the FMA/LATE_L/ADDR switches (second session, first GPU call): new
    # winners for d64, d128 (every key) and d256 non-causal short, 1.05-1.77x FlexAttention's and
    # 1.21-1.77x FA2's TFLOP/s at the grid's points; d256 and decode from its second call (d256:
    # 1.21-1.73x Flex, 1.02-1.78x FA2; decode graph-timed 1.06-1.46x SDPA at B = 1, 0.96x at B = 16).
    **{(k[0], "sm90", dtype) + k[1:]: dict(row) for k, row in _SM90_ROWS.items() for dtype in ("bf16", "fp16")},
    ("fwd", "any", "*", "d64", "*", "*"): {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
    ("fwd", "any", "*", "d128", "*", "*"): {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},
    ("fwd", "any", "*", "d256", "*", "*"): {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 8, "num_stages": 2},
    ("fwd", "any", "fp32", "d64", "*", "*"): {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 8, "num_stages": 2},
    ("fwd", "any", "fp32", "*", "*", "*"): {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 8, "num_stages": 2},
    ("decode", "any", "*", "*", "*", "*"): {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3,
                                             **_DECODE_HEURISTICS},
    ("decode", "any", "*", "d256", "*", "*"): {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 8, "num_stages": 3,
                                                **_DECODE_HEURISTICS},
    ("decode", "any", "fp32", "*", "*", "*"): {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 8, "num_stages": 2,
                                                **_DECODE_HEURISTICS},
    ("fwd", "cpu", "*", "*", "*", "*"): {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 1, "num_stages": 1,
                                          "TWO_PARTS": True},
    ("decode", "cpu", "*", "*", "*", "*"): {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 1, "num_stages": 1,
                                             "max_rows": 64, "max_q": 8, "waves": 1,
                                             "min_split_keys": 32, "merge_warps": 1},
})

# ---------------------------------------------------------------------------------------------
# Triton attention backward (tiled_attn/triton/attention_bwd.py): key (kernel, arch, dtype, D class)
# with kernel "dkdv" (a program per key tile, BLOCK_N keys resident with their dK/dV accumulators,
# BLOCK_M query rows per step) or "dq" (a program per query tile, BLOCK_M rows resident with dQ,
# BLOCK_N keys per step); dtype "*" matches fp16 and bf16 (float32 has its own rows: the ieee dot
# runs on the FMA units and holds more per element); lookup exact arch, then "any".
# The "any" rows are the largest tiles that build for sm_90a with no register spill in either causal
# mode (ptxas -v, 2026-11-24; the Triton tutorial's 32x128 dK/dV tile at 4 warps spills 200-400
# bytes here): dK/dV 32x128 at 8 warps for D <= 64, 16x128 at D <= 128, 32x32 at D = 256; dQ
# 128x32 (4 warps, 8 at D = 128), 64x32 at D = 256. tests/test_attention_backward_sm90.py re-checks
# every row; benchmarks/tune_triton_attention_backward.py times the candidates on the GPU.
# "cpu" rows: the interpreter's (several tiles at the tests' small shapes).
# ---------------------------------------------------------------------------------------------
TRITON_ATTENTION_BACKWARD: dict = _Table({
    # sm90 rows: measured on the H100 by benchmarks/tune_triton_attention_backward.py (2026-11-24,
    # bf16, N = 4096, B·N = 16k, H·D = 2048; benchmarks/results/2026-11-24-h100-tune-attention-
    # backward.txt). The dQ pass beat the atomic mode at every point (D = 64: 5.1 vs 7.3 ms,
    # causal 2.6 vs 3.6; D = 128: 5.4 vs 6.7, causal 2.7 vs 3.2), so every row keeps "pass".
    # Best backward 254-271 TFLOP/s (counting 2.5x the forward's FLOPs). A third mode, dQ added by
    # TMA bulk reduce-adds from the dK/dV kernel (FlashAttention-3's way), measured slower still on
    # the H200 (194-200 vs 250-272 TFLOP/s) and was not kept:
    # benchmarks/results/2026-11-26-h200-tune-attention-backward-tma.txt says why.
    ("dkdv", "sm90", "*", "d64"): {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
    ("dq", "sm90", "*", "d64"): {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
    # D = 128 dK/dV: 32x128 tiles with one causal loop ("band": False; with the band they spill),
    # remeasured on the H200 (2026-11-26, same method: 2026-11-26-h200-tune-attention-backward.txt):
    # 5.18-5.20 ms against 16x128's 5.52 (causal 2.45-2.58 against 2.73-2.87).
    ("dkdv", "sm90", "*", "d128"): {"BLOCK_M": 32, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2, "band": False},
    ("dq", "sm90", "*", "d128"): {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 3},
    ("dkdv", "any", "*", "d64"): {"BLOCK_M": 32, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3},
    ("dq", "any", "*", "d64"): {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 4, "num_stages": 4},
    ("dkdv", "any", "*", "d128"): {"BLOCK_M": 16, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3},
    ("dq", "any", "*", "d128"): {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 8, "num_stages": 3},
    ("dkdv", "any", "*", "d256"): {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 8, "num_stages": 2},
    ("dq", "any", "*", "d256"): {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 8, "num_stages": 2},
    ("dkdv", "any", "fp32", "d64"): {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
    ("dq", "any", "fp32", "d64"): {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2},
    ("dkdv", "any", "fp32", "d128"): {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 8, "num_stages": 1},
    ("dq", "any", "fp32", "d128"): {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 8, "num_stages": 1},
    ("dkdv", "any", "fp32", "d256"): {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 8, "num_stages": 1},
    ("dq", "any", "fp32", "d256"): {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 8, "num_stages": 1},
    ("dkdv", "cpu", "*", "*"): {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 1, "num_stages": 1},
    ("dq", "cpu", "*", "*"): {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 1, "num_stages": 1},
})
# Fields a row may leave out. "dq" (dkdv rows): "pass" (dQ by its own kernel: deterministic) or
# "atomic" (float32 atomic adds from the dK/dV kernel: 5 matmuls instead of 7, not bitwise
# repeatable; deterministic=True takes "pass" regardless). attention_bwd.py says more.
# "band" (dkdv rows): causal walks the diagonal band in its own masked loop (True) or masks every
# step of one loop (False: fewer registers, a mask a step; attention_bwd_dkdv_kernel says more).
TRITON_ATTENTION_BACKWARD_DEFAULTS = {"dq": "pass", "band": True}
# The delta pre-pass (rowsum(dO·O)) and the atomic mode's dQ store: rows per program and warps
# (memory-bound passes).
TRITON_ATTENTION_BACKWARD_DELTA = {"BLOCK_M": 64, "num_warps": 4}

# The wgmma backward (tiled_attn/cuda/attention_backward.py): backend "cuda"'s, and backend=None's
# wherever it covers the call. (arch, head dim) -> a row whose "kernel" "wgmma" runs
# csrc/attention/sm90/flash_bwd_sm90_kernel.cuh with "block_m" query rows per step (64; 128 at D = 64
# only); no row: the Triton backward. benchmarks/tune_cuda_attention_backward.py, H100, 2026-11-28
# (bf16, B·N = 16k tokens, H·D = 2048, N 1k / 4k / 16k, the backward alone, TFLOP/s):
#   D = 64:  block_m 128 291 / 356 / 362, causal 208 / 320 / 376; block_m 64 220 / 260 / 274, causal
#            163 / 234 / 270; the Triton backward 249 / 265 / 275, causal 203 / 270 / 286.
#   D = 128: block_m 64 308 / 390 / 412, causal 221 / 337 / 404; Triton 224 / 265 / 263, causal
#            203 / 281 / 314.
# "tile_us": one query tile's step of one CTA (5 products of block_m x 128 x D), from those rates
# (10.5 MFLOP at 362 and 412 TFLOP/s over 132 SMs): the unit of the schedule model below.
CUDA_ATTENTION_BACKWARD: dict = {
    ("sm90", 64): {"kernel": "wgmma", "block_m": 128, "tile_us": 3.8},
    ("sm90", 128): {"kernel": "wgmma", "block_m": 64, "tile_us": 3.4},
}
# The schedule of the wgmma backward's grid (tiled_attn/cuda/attention_backward.py `schedule`). A CTA
# walks every query head of its kv head's group, so a grid of about one CTA per SM (B·Hkv·Nk/128 small:
# the Llama-1B training step at N = 2048 is 128 CTAs on 132 SMs, causal) runs as long as its longest
# CTA: 65 tiles where the average is 35 (H200 profile, 2026-11-28: 3.84 ms of backward against cuDNN's
# 2.76 in a 16-layer step). Two remedies, chosen together: split each group among `kv_split` CTAs
# (float32 partial dK / dV, summed afterwards), and launch the CTAs key-tile-major (longest_first: the
# longest causal walks first, where x-fastest order starts some slots' last). The planner simulates the
# block scheduler (CTAs in launch order, one per SM, each as long as its tiles plus "cta_tiles" for K / V
# loads and the epilogue) for each divisor of the group (grids of at most "max_waves" CTAs per SM: the
# partials' memory stays bounded) and each order (causal grids of at most "order_waves"), adds the
# partials' traffic at "reduce_gbps", and takes the fastest, a change only where it gains "min_gain".
# Measured (benchmarks/probe_bwd_schedule.py, H200, 2026-11-28, the backward alone, every schedule
# forced; results/2026-11-28-h200-s24-probe-bwd-schedule.txt): the model's plain-order times within 1-6%
# of the GPU's at 8 shapes. Llama-1B layer (B = 1, 32 / 8 heads, D = 64): N = 2048 0.276 ms plain, 0.167
# split in 2 (planned), 0.187 in 4; N = 4096 0.800 plain, 0.524 key-tile-major (planned); N = 8192 2.358
# plain, 1.935 key-tile-major (planned; D = 128 4.287 -> 3.626). MHA grids of 15-31 waves ran 3-10%
# slower key-tile-major (one head's Q / dO no longer shared in L2 by the CTAs resident together, which
# the model does not see); the model gives them < 6%, under min_gain, so they keep the plain launch.
# A second run (…-probe-bwd-schedule-b.txt), each planned choice the fastest measured or within 5% of
# it: GQA B = 2 / 4 at N = 2048 0.449 -> 0.309 / 0.746 -> 0.615 ms key-tile-major; MHA B = 1 at N =
# 4096 (8 waves) D = 64 0.606 -> 0.557, D = 128 0.637 -> 0.542; B = 2, 32 heads, N = 2048 0.351 -> 0.335.
CUDA_ATTENTION_BACKWARD_SPLIT = {"cta_tiles": 1.0, "reduce_gbps": 2500.0, "min_gain": 0.1, "max_waves": 2,
                                 "order_waves": 16}

# ---------------------------------------------------------------------------------------------
# CUDA attention (csrc/attention/) — owned by that module's author.
# ---------------------------------------------------------------------------------------------
# Key: ("fwd", arch, dtype, D) for every launch, and ("fwd", arch, dtype, D, "causal") where causal
# launches take a different row; dtype "*" (fp16 and bf16 share a tile). A MIRROR of TileConfig<D>
# (and TileConfig<D, true>) in csrc/attention/flash_fwd.cuh, which is what the kernel runs (the tile
# is template arguments): change both together (tests/test_cuda_attention_kernel.py checks they
# agree). block_m: query rows per CTA, block_n: keys per pipeline tile, warps, stages: K (and V) slots
# in shared memory, flags: q_in_regs (Q's mma fragments held in registers for the whole key loop),
# fold (softmax scale folded into the exp2 FFMA), lean (unpredicated K/V copies of whole tiles),
# joint (one barrier per key tile), skew (two warp groups half an iteration apart), lazy (accumulator
# rescale skipped when no row max moved) — flash_fwd.cuh says what each does and why; min_blocks:
# CTAs per SM the register allocation must allow. Rows follow FlashAttention-2's sm80/sm90 choices
# until benchmarks/sweep_cuda_attention.py measures the variants on the H100 (its report prints the
# rows to paste here). Every row compiles with 0 spill bytes for sm_90a (ptxas -v, nvcc 13.0).
# smem_bytes = (block_m + (2·stages + skew)·block_n)·(D+8)·2.
CUDA_ATTENTION: dict = _Table({
    ("fwd", "any", "*", 32): {"block_m": 128, "block_n": 64, "warps": 4, "stages": 2, "flags": ("q_in_regs",), "min_blocks": 1},
    ("fwd", "any", "*", 64): {"block_m": 128, "block_n": 64, "warps": 4, "stages": 2, "flags": ("q_in_regs", "fold", "lean"), "min_blocks": 1},
    ("fwd", "any", "*", 96): {"block_m": 128, "block_n": 64, "warps": 4, "stages": 2, "flags": (), "min_blocks": 1},
    ("fwd", "any", "*", 128): {"block_m": 128, "block_n": 64, "warps": 4, "stages": 2, "flags": ("fold", "lean"), "min_blocks": 1},
    ("fwd", "any", "*", 192): {"block_m": 128, "block_n": 64, "warps": 8, "stages": 2, "flags": (), "min_blocks": 1},
    ("fwd", "any", "*", 256): {"block_m": 64, "block_n": 64, "warps": 4, "stages": 1, "flags": (), "min_blocks": 1},
    # Split-KV (decode; flash_fwd_kernel<Tr, T, true> + attention_merge.cuh). The tile fields MIRROR
    # DecodeConfig<D> in flash_fwd.cuh (a test checks): a one-warp CTA of 16 packed (query, query head) rows
    # of one kv head. The dispatch and split heuristics (tiled_attn/cuda/attention.py split_plan): the split
    # path when Nq·Hq/Hkv <= max_rows and the last query sees >= min_keys keys; splits: enough CTAs to fill
    # every SM's resident slots once (ctas_per_sm from the smem size, at most 8 one-warp CTAs), no split
    # shorter than min_split_keys. Not yet measured on the H100 (guesses from the arithmetic in
    # flash_fwd.cuh's DecodeConfig comment).
    **{("decode", "any", "*", d): {"block_m": 16, "block_n": 32 if d == 256 else 64, "warps": 1, "stages": 2,
                                   "flags": ("fold", "lean", "joint") if d == 256
                                   else ("q_in_regs", "fold", "lean", "joint"),
                                   "min_blocks": 1, "max_rows": 64, "min_keys": 512, "min_split_keys": 128,
                                   "max_ctas_per_sm": 8}
       for d in (32, 64, 96, 128, 192, 256)},
    # ---- wgmma forward (csrc/attention/sm90/, sm_90a only) ----
    # "kernel": which CUDA forward kernel a launch runs, "mma" (flash_fwd_kernel.cuh: mma.sync,
    # FlashAttention-2's structure) or "wgmma" (flash_fwd_sm90_kernel.cuh: warpgroup MMA). A row
    # without the field is "mma": every ("fwd", ...) row above, so the default stays the mma.sync
    # kernel until the H100 has measured the wgmma one (tiled_attn/cuda/attention.py select_kernel
    # reads the field of the tile_config row; attention_forward(kernel=) and forced_kernel() override).
    # The ("fwd_wgmma", "sm90", "*", D) rows describe the wgmma kernel's tile (a MIRROR of
    # flash_fwd_sm90::Traits<D>; tests/test_cuda_attention_sm90.py checks): 2 consumer warpgroups of
    # 64 query rows each, block_n keys per tile through `stages` cp.async slots, 128-byte-swizzled
    # shared tiles. Compiled with 0 spills for sm_90a (nvcc 13.0; registers 167 / 211 / 231 at
    # D = 64 / 128 / 256); verified on the CPU emulator (tests/emulation/flash_fwd_sm90_emulator.cpp);
    # NOT YET MEASURED ON THE H100.
    **{("fwd_wgmma", "sm90", "*", d): {"kernel": "wgmma", "block_m": 128, "block_n": 128 if d <= 128 else 64,
                                      "warpgroups": 2, "stages": 2, "swizzle": 128}
       for d in (64, 128, 256)},
})
