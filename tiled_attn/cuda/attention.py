"""The CUDA attention forward: csrc/attention/ (FlashAttention-2's structure on mma.sync tensor cores).

Called by tiled_attn/attention.py after validation (`_checks.check_attention`), with a preallocated
`out` (B, Hq, Nq, D) laid out (B, Nq, Hq, D) in memory and a contiguous float32 `lse` (B, Hq, Nq).
The kernel reads q, k, v through their (batch, head, seq) strides: a q/k/v split from a packed
(B, N, 3, H, D) projection and transposed is read in place.

Copies: the kernel moves 16-byte chunks, so each of q, k, v must have a contiguous head dim
(stride(-1) == 1), a 16-byte aligned base pointer and batch/head/seq strides that are multiples of
8 elements (dims of size 1 excepted). A tensor that is not is copied with `.contiguous()` first —
the only copy this backend makes of an input (an odd-offset slice or a last-dim-strided view, not the
common layouts). `out` and `lse` from tiled_attn/attention.py always qualify; another `out` or `lse`
gets a temporary that is copied back.

Tile shapes per head dim (and per causal launch where they differ) live in
csrc/attention/flash_fwd.cuh (TileConfig, compile-time: the templates need them) and are mirrored in
configs.CUDA_ATTENTION; `tile_config(d, causal=...)` returns that row.

Split-KV (flash-decoding) for short queries against long keys: `split_plan` picks it from the ("decode",
"any", "*", D) row of configs.CUDA_ATTENTION when Nq·group <= max_rows (group = Hq/Hkv) and the last
query sees >= min_keys keys. One CTA (DecodeConfig<D> in flash_fwd.cuh: one warp, a 16-row mma tile)
owns the Nq·group rows of one (batch, kv head), packed as (query, query head) pairs, so each K/V tile is
read once per GQA group instead of once per query head, and one key range of `num_splits`; it writes the
rows' unnormalized partial state (acc float32 [D], m, l) to a float32 workspace of
B·Hq·Nq·num_splits·(D+2) elements (torch.empty on the current stream: no N×N buffer). A second kernel
(csrc/attention/attention_merge.cuh) merges each row's partials max-first with the header's merge verbs
(online_softmax.cuh AttnRowState::merge_max / merge_add) and writes out and lse; a split a row does not
see (causal, or past the keys) is the identity state and adds nothing, and a row with no visible key at
all gets output 0 and lse -inf. num_splits: enough CTAs to fill every SM's resident slots once (slots
from the tile's shared memory), no split shorter than min_split_keys keys, and none left empty. Both
launches go on the current stream with no host sync and no data-dependent host logic (the plan depends
on shapes only), so a decode step can be captured in a CUDA graph. The decode suite's "cuda" provider
(benchmarks/suite_decode.py: Nq = 1, Hq = 32, Hkv = 8, D = 128) runs this path. Verified on the CPU
emulator (tests/emulation/flash_fwd_emulator.cpp); NOT YET MEASURED ON THE H100: its speed and the
heuristics' values are predictions (flash_fwd.cuh's DecodeConfig). `attention_forward(..., num_splits=)`
forces a choice (tests).

The wgmma forward (csrc/attention/sm90/, sm_90a only): a second forward kernel on Hopper's warpgroup
MMA (wgmma.mma_async m64nNk16 for Q·Kᵀ and P·V, operands read from 128-byte-swizzled shared memory
through matrix descriptors, two consumer warpgroups of 64 query rows; flash_fwd_sm90_kernel.cuh says
more), for head dims 64, 128, 256 in fp16/bf16. Compiled into the extension only on compute
capability 9.0. "wgmma_ws" is its warp-specialized form (sm90/flash_fwd_sm90_ws_kernel.cuh,
FlashAttention-3's producer/consumer structure: a producer warp loads Q, K and V tiles by TMA into a
shared-memory ring guarded by mbarriers; two consumer warpgroups compute, with no CTA barrier in the
loop); same dtypes and results, and head dims 96 and 192 besides (SM90_WS_HEAD_DIMS: D = 96 on
128-column shared tiles that TMA zero-fills past D).
Which kernel a launch runs: `attention_forward(..., kernel="mma" | "wgmma" | "wgmma_ws")`, else
`forced_kernel(...)` (a context manager: the tests' and benchmarks' hook, since ta.attention has no
such argument), else the configs.ATTENTION_SELECT row for the size (wgmma_ws where measured faster),
else the "kernel" field of the tile_config row ("mma" where absent: today every row). A forced
"wgmma"/"wgmma_ws" runs that kernel for every shape (no split-KV plan); a ValueError names the
argument on a device other than sm_90 or another head dim. Verified on the CPU emulator
(tests/emulation/flash_fwd_sm90_emulator.cpp) and on an H200 (tests, memcheck, racecheck; speed:
README's wgmma section); the H100 has run the wgmma_ws grid at D 64 / 128 / 256 only (2026-11-27).
"""
from __future__ import annotations

import contextlib

import torch

from .. import configs
from .. import _plan
from .._plan import current_stream as _stream
from . import _build

__all__ = ["HEAD_DIMS", "DTYPES", "require_attention", "attention_forward", "tile_config", "decode_config",
           "split_plan", "KERNELS", "SM90_HEAD_DIMS", "SM90_WS_HEAD_DIMS", "sm90_head_dims", "forced_kernel",
           "select_kernel", "reads_in_place"]

# What the templates instantiate (csrc/attention/flash_fwd_hdim*.cu); attention_head_dim_supported
# in the extension is the C++ side of the same list.
HEAD_DIMS = (32, 64, 96, 128, 192, 256)
DTYPES = (torch.float16, torch.bfloat16)


def _extension(device: torch.device):
    from ._build import load
    return load(device)


def _call(fn, *args):
    return _build.call(fn, *args)  # every call into the extension goes through it (it raises the errors)


def require_attention(q: torch.Tensor) -> None:
    """Raise ValueError unless backend='cuda' runs q's head dim and dtype; then build/load the
    extension (RuntimeError if it cannot be built). Called before any launch."""
    d = q.shape[-1]
    if d not in HEAD_DIMS or q.dtype not in DTYPES:
        got = f"D={d}" if d not in HEAD_DIMS else f"dtype {str(q.dtype).replace('torch.', '')}"
        raise ValueError(f"backend='cuda' supports head dims {HEAD_DIMS} and float16/bfloat16, got {got}; "
                         "use backend='triton'")
    if q.device.type != "cuda":
        raise ValueError(f"backend='cuda' needs CUDA tensors, got q on {q.device}")
    ext = _extension(q.device)
    if not _call(ext.attention_head_dim_supported, d):
        raise RuntimeError(f"the CUDA extension does not instantiate head dim {d} although "
                           f"tiled_attn/cuda/attention.py lists it: rebuild the extension")


def tile_config(d: int, device: torch.device | None = None, causal: bool = False) -> dict:
    """The CUDA_ATTENTION row (tile shape, warps, stages, flags) the kernel uses for head dim d: the
    ("fwd", arch, "*", d, "causal") row for a causal launch where there is one, else the plain row."""
    arch = configs.arch(device) if device is not None else "any"
    if causal:
        try:
            return configs.lookup(configs.CUDA_ATTENTION, ("fwd", arch, "*", d, "causal"), "CUDA attention")
        except KeyError:
            pass
    return configs.lookup(configs.CUDA_ATTENTION, ("fwd", arch, "*", d), "CUDA attention")


def decode_config(d: int, device: torch.device | None = None) -> dict:
    """The ("decode", arch, "*", d) row of CUDA_ATTENTION: the split-KV tile (a mirror of
    DecodeConfig<d> in flash_fwd.cuh) and the split heuristics."""
    arch = configs.arch(device) if device is not None else "any"
    return configs.lookup(configs.CUDA_ATTENTION, ("decode", arch, "*", d), "CUDA attention")


# An H100's shared memory per SM (228 KB: split_plan's default, for planning without a device; a
# launch passes its device's own figure) and what the runtime reserves per CTA (1 KB).
SMEM_PER_SM = 228 * 1024
SMEM_RESERVED_PER_CTA = 1024


def _smem_bytes(cfg: dict, d: int) -> int:
    """The split tile's dynamic shared memory: (block_m + 2·stages·block_n)·(D + 8)·2 bytes."""
    return (cfg["block_m"] + 2 * cfg["stages"] * cfg["block_n"]) * (d + 8) * 2


def split_plan(b: int, hq: int, hkv: int, nq: int, nk: int, d: int, causal: bool, causal_offset: int,
               sm_count: int, cfg: dict, smem_per_sm: int = SMEM_PER_SM) -> int:
    """0: the forward kernel; S >= 1: the split-KV path with S key splits (`cfg`: decode_config(d)).

    Split when the packed rows of a (batch, kv head), Nq·Hq/Hkv, fit max_rows and the keys the last
    row sees (all Nk, or Nq + causal_offset of them under causal) number at least min_keys.
    S fills the SMs' resident CTA slots once (ctas_per_sm from the tile's shared memory, at most
    max_ctas_per_sm) over the B·Hkv·ceil(rows / block_m) row tiles, keeps every split at least
    min_split_keys keys, and is then cut so that no split is empty: the kernel's split length
    (flash_fwd_launch.cuh split_len_for) is the keys any row sees over S, rounded up to block_n."""
    rows = nq * (hq // hkv)
    seen = min(max(nq + causal_offset, 0), nk) if causal else nk
    # Gated on the keys some row sees, not Nk: a causal window of a few keys is one short tile loop
    # for the forward kernel, and no row seeing a key needs no workspace (it writes 0 / -inf).
    if rows > cfg["max_rows"] or seen < max(cfg["min_keys"], 1):
        return 0
    ctas_per_sm = min(cfg["max_ctas_per_sm"], smem_per_sm // (_smem_bytes(cfg, d) + SMEM_RESERVED_PER_CTA))
    tiles = b * hkv * -(-rows // cfg["block_m"])
    splits = max(1, ctas_per_sm * sm_count // tiles)
    splits = min(splits, max(1, -(-seen // cfg["min_split_keys"])))
    split_len = -(-(-(-seen // splits)) // cfg["block_n"]) * cfg["block_n"]
    return -(-seen // split_len)


_SM_LIMITS: dict = {}


def _sm_limits(device: torch.device) -> tuple[int, int]:
    """(SM count, shared memory per SM in bytes) of q's device, read once per device."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_LIMITS:
        props = torch.cuda.get_device_properties(index)
        _SM_LIMITS[index] = (props.multi_processor_count, props.shared_memory_per_multiprocessor)
    return _SM_LIMITS[index]


def _sm_count(device: torch.device) -> int:
    return _sm_limits(device)[0]


# ---- kernel selection: mma.sync (flash_fwd_kernel.cuh) or wgmma (sm90/flash_fwd_sm90_kernel.cuh) ----
KERNELS = ("mma", "wgmma", "wgmma_ws")
SM90_KERNELS = ("wgmma", "wgmma_ws")
# What csrc/attention/sm90/flash_fwd_sm90_hdim*.cu instantiate (attention_sm90_head_dim_supported):
# the cp.async kernel ("wgmma") whole 64-column blocks, the warp-specialized one ("wgmma_ws") also
# D = 96 (on 128-column shared tiles that TMA zero-fills past D) and 192.
SM90_HEAD_DIMS = (64, 128, 256)
SM90_WS_HEAD_DIMS = (64, 96, 128, 192, 256)


def sm90_head_dims(kernel: str) -> tuple[int, ...]:
    """The head dims an sm90 kernel ("wgmma" or "wgmma_ws") instantiates."""
    return SM90_WS_HEAD_DIMS if kernel == "wgmma_ws" else SM90_HEAD_DIMS


_forced: list = [None]  # forced_kernel's value (a list: no `global` statement)


@contextlib.contextmanager
def forced_kernel(kernel: str | None):
    """Within the block, attention_forward calls without kernel= run `kernel` (one of KERNELS; None:
    the config row's). The hook through which tests and benchmarks force the wgmma kernel behind
    ta.attention(..., backend="cuda")."""
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS} or None, got {kernel!r}")
    previous = _forced[0]
    _forced[0] = kernel
    _plan.clear_all()  # plans made before chose their kernel without this one
    try:
        yield
    finally:
        _forced[0] = previous
        _plan.clear_all()


def _capability(device: torch.device) -> tuple[int, int] | None:
    return tuple(torch.cuda.get_device_capability(device)) if device.type == "cuda" else None


def select_kernel(kernel: str | None, q: torch.Tensor, causal: bool = False, nk: int | None = None) -> str:
    """The forward kernel for q (against nk keys): `kernel` if given, else the kernel of the
    configs.ATTENTION_SELECT "cuda" row that applies at min(Nq, nk) on q's device, else the "kernel"
    field of q's tile_config row ("mma" where the row has none). ValueError, naming the argument, for
    an unknown name, or for "wgmma"/"wgmma_ws" on a device other than compute capability 9.0 or a
    head dim they do not instantiate."""
    d = q.shape[-1]
    if kernel is None and nk is not None and q.device.type == "cuda":
        row = configs.attention_select(configs.arch(q.device), d, causal, min(q.shape[2], nk))
        if row is not None and row[0] == "cuda":
            kernel = row[1]
    if kernel is None:
        kernel = tile_config(d, q.device, causal=causal).get("kernel", "mma") if d in HEAD_DIMS else "mma"
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS} or None, got {kernel!r}")
    if kernel in SM90_KERNELS:
        cap = _capability(q.device)
        if cap != (9, 0):
            where = f"compute capability {cap[0]}.{cap[1]}" if cap else q.device.type
            raise ValueError(f"kernel={kernel!r} needs an sm_90 (Hopper) CUDA device, got {where} ({q.device}); "
                             "use kernel='mma'")
        if d not in sm90_head_dims(kernel):
            raise ValueError(f"kernel={kernel!r} supports head dims {sm90_head_dims(kernel)}, got D={d}; "
                             "use kernel='mma'")
    return kernel


def reads_in_place(t: torch.Tensor) -> bool:
    """The kernels read t (B, H, N, D) without a copy (per call its base address must also be
    16-byte aligned): what backend=None checks before it picks this backend."""
    return _layout_ready(t, t.shape[:3])


def _layout_ready(t: torch.Tensor, sizes) -> bool:
    """The kernels' 16-byte chunks apply to this layout: contiguous last dim, strides in multiples
    of 8 elements on every dim that has more than one index (the base address, which a plan's
    signature does not fix, is checked per call: 16-byte aligned)."""
    if t.stride(-1) != 1:
        return False
    return all(n <= 1 or s % 8 == 0 for s, n in zip(t.stride()[:3], sizes))


def plan_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 scale: float, causal: bool, causal_offset: int, *, num_splits: int | None = None,
                 kernel: str | None = None):
    """run(q, k, v, out, lse): fill `out` (B, Hq, Nq, D) and `lse` (B, Hq, Nq) float32 with attention
    and its log-sum-exp, for tensors with these shapes, strides, dtype and device.

    With `causal`, query i sees key j iff j <= i + causal_offset; a row that sees no key gets output
    0 and lse -inf. Launches on the current stream of q's device. `num_splits` (a test hook): None
    plans (split_plan), 0 forces the forward kernel, n >= 1 the split-KV path with n key splits
    (splits past the keys included: they write the identity state). `kernel`: one of KERNELS or None
    (forced_kernel's, else the config row's; see the module docstring); a forced sm90 kernel takes no
    split (num_splits must be None or 0). Loads the extension, reads the device's limits and looks
    up the config rows here, once.
    """
    require_attention(q)
    forced = kernel if kernel is not None else _forced[0]
    kernel = select_kernel(forced, q, bool(causal), k.shape[2])
    if kernel in SM90_KERNELS and forced is not None:
        if num_splits not in (None, 0):
            raise ValueError(f"num_splits must be None or 0 with kernel={kernel!r} (it has no split-KV path), "
                             f"got {num_splits!r}")
        num_splits = 0
    b, hq, nq, d = q.shape
    if b * hq * nq == 0:
        return lambda q, k, v, out, lse: None
    if k.shape[2] == 0:
        def no_keys(q, k, v, out, lse):
            out.zero_()
            lse.fill_(float("-inf"))
        return no_keys
    ext = _extension(q.device)
    if num_splits is None:
        sm_count, smem_per_sm = _sm_limits(q.device)
        num_splits = split_plan(b, hq, k.shape[1], nq, k.shape[2], d, bool(causal), int(causal_offset),
                                sm_count, decode_config(d, q.device), smem_per_sm)
    elif not isinstance(num_splits, int) or isinstance(num_splits, bool) or not 0 <= num_splits <= 65535:
        raise ValueError(f"num_splits must be None or an int in [0, 65535], got {num_splits!r}")
    if num_splits == 0 and kernel in SM90_KERNELS and not getattr(ext, "has_attention_sm90", False):
        raise RuntimeError("the CUDA extension was built without the wgmma attention kernel "
                           "(csrc/attention/sm90/): rebuild it on an sm_90 device")
    # Inputs whose layout the 16-byte copies cannot take are copied (.contiguous()) on every call;
    # those that can are copied only when their base address is not 16-byte aligned.
    layout_ok = [_layout_ready(t, t.shape[:3]) for t in (q, k, v)]
    all_ready = all(layout_ok)
    out_ok, lse_ok = _layout_ready(out, out.shape[:3]), lse.is_contiguous() and lse.dtype == torch.float32
    scale, causal, causal_offset, index = float(scale), bool(causal), int(causal_offset), q.device.index
    workspace = b * hq * nq * num_splits * (d + 2)
    post = ()  # arguments after the stream
    if num_splits == 0:
        fn = ext.attention_fwd_sm90 if kernel in SM90_KERNELS else ext.attention_fwd
        tail = (scale, causal, causal_offset)
        post = (kernel == "wgmma_ws",) if kernel in SM90_KERNELS else ()
    else:
        fn, tail = ext.attention_fwd_split, (num_splits, scale, causal, causal_offset)
    call = _build.call

    def run(q, k, v, out, lse):
        if not all_ready or (q.data_ptr() | k.data_ptr() | v.data_ptr()) % 16:
            # a fresh copy, never .contiguous(): that returns a contiguous view off 16 bytes as it is
            # (seen on an H200: a view one element into its storage, cudaErrorMisalignedAddress)
            q, k, v = (t if ok and t.data_ptr() % 16 == 0 else t.clone(memory_format=torch.contiguous_format)
                       for t, ok in zip((q, k, v), layout_ok))
        out_k = out if out_ok and out.data_ptr() % 16 == 0 else torch.empty(
            b, nq, hq, d, dtype=out.dtype, device=out.device).transpose(1, 2)
        lse_k = lse if lse_ok else torch.empty(b, hq, nq, dtype=torch.float32, device=lse.device)
        if num_splits == 0:
            call(fn, q, k, v, out_k, lse_k, *tail, _stream(index), *post)
        else:
            # The partials of every (row, split): allocated on the current stream, read by the merge
            # launched right after on the same stream.
            ws = torch.empty(workspace, dtype=torch.float32, device=q.device)
            call(fn, q, k, v, out_k, lse_k, ws, *tail, _stream(index))
        if out_k is not out:
            out.copy_(out_k)
        if lse_k is not lse:
            lse.copy_(lse_k)
    return run


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                      scale: float, causal: bool, causal_offset: int, *, num_splits: int | None = None,
                      kernel: str | None = None) -> None:
    """Fill `out` and `lse` (see plan_forward), planned for this one call (tests, benchmarks)."""
    plan_forward(q, k, v, out, lse, scale, causal, causal_offset, num_splits=num_splits,
                 kernel=kernel)(q, k, v, out, lse)
