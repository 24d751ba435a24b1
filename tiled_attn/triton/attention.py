"""The Triton attention forward: pick a kernel and its config (configs.TRITON_ATTENTION), launch.

Called by tiled_attn/attention.py after validation, with preallocated `out` (B, Hq, Nq, D) (any
strides) and a contiguous float32 `lse` (B, Hq, Nq). Inputs are used through their strides: a q/k/v
split from a packed (B, N, 3, H, D) tensor and transposed is read in place, never copied.

Two kernels: attention_fwd.py (one program per query tile; training/prefill shapes) and
attention_decode.py (GQA group packed into the tile's rows, keys split over programs, partial states
merged; short queries against long keys). The decode row of the config table says when the second
one applies and how many splits to use.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import os

import torch
import triton

from .. import _checks, configs
from . import online
from .attention_decode import attention_decode_kernel, attention_merge_kernel
from .attention_fwd import attention_fwd_kernel

__all__ = ["attention_forward", "config", "plan"]

# tl.dot needs every tile dimension >= 16 (the smallest MMA shape Triton emits).
MIN_DOT = 16
# Above this stride, offsets inside one tile (up to 256 rows × stride) can pass 2^31: use int64.
WIDE_STRIDE = 2 ** 31 // 256


def d_class(d: int) -> str:
    return "d64" if d <= 64 else "d128" if d <= 128 else "d256"


def size_class(n_k: int) -> str:
    return "short" if n_k <= 1024 else "long"


def config(kernel: str, device: torch.device, dtype: torch.dtype, d: int, causal: bool, n_k: int) -> dict:
    """The TRITON_ATTENTION row for this call: exact key first, then wildcards; arch before 'any'."""
    arch = configs.arch(device)
    exact = (configs.dtype_key(dtype), d_class(d), causal, size_class(n_k))
    for a in (arch, "any"):
        for rest in itertools.product(*((e, "*") for e in exact)):
            row = configs.TRITON_ATTENTION.get((kernel, a) + rest)
            if row is not None:
                return row
    raise KeyError(f"no TRITON_ATTENTION config for {(kernel, arch) + exact}: add a row to "
                   "tiled_attn/configs.py")


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return os.cpu_count() or 1  # the interpreter: one "SM" per core


def _effective_causal(causal: bool, offset: int, n_q: int, n_k: int) -> tuple[bool, int]:
    """Clamp the offset to where it changes the mask (so i + offset cannot overflow int32), and drop
    the mask when every query sees every key (offset >= Nk - 1)."""
    if not causal or offset >= n_k - 1:
        return False, 0
    return True, max(offset, -n_q)


def plan(q: torch.Tensor, k: torch.Tensor, causal: bool, causal_offset: int, *,
         kernel: str | None = None, num_splits: int | None = None) -> dict:
    """Which kernel runs, with which launch parameters. `kernel`/`num_splits` force a choice (the
    tests use them to exercise the split-KV path on small shapes)."""
    b, hq, n_q, d = q.shape
    hkv, n_k = k.shape[1], k.shape[2]
    group = hq // hkv
    causal, offset = _effective_causal(causal, causal_offset, n_q, n_k)
    if kernel is None:
        dec = config("decode", q.device, q.dtype, d, causal, n_k)
        kernel = "decode" if n_q * group <= dec["max_rows"] or n_q <= dec["max_q"] else "fwd"
    cfg = dict(config(kernel, q.device, q.dtype, d, causal, n_k))
    p = {"kernel": kernel, "causal": causal, "offset": offset, "group": group,
         "BLOCK_D": max(MIN_DOT, triton.next_power_of_2(d)), **cfg}
    if kernel == "fwd":
        p["m_tiles"] = triton.cdiv(n_q, cfg["BLOCK_M"])
        return p
    rows = n_q * group
    p["BLOCK_M"] = max(MIN_DOT, min(cfg["BLOCK_M"], triton.next_power_of_2(rows)))
    p["m_tiles"] = triton.cdiv(rows, p["BLOCK_M"])
    # Keys some query can see: a causal mask hides the end of the keys from every row.
    n_seen = min(n_k, n_q + offset) if causal else n_k
    if num_splits is None:
        programs = b * hkv * p["m_tiles"]
        wanted = triton.cdiv(cfg["waves"] * _sm_count(q.device), programs)
        num_splits = max(1, min(wanted, triton.cdiv(n_seen, cfg["min_split_keys"])))
    num_splits = max(1, min(num_splits, triton.cdiv(max(n_seen, 1), cfg["BLOCK_N"])))
    p["split_len"] = triton.cdiv(triton.cdiv(max(n_seen, 1), num_splits), cfg["BLOCK_N"]) * cfg["BLOCK_N"]
    p["num_splits"] = triton.cdiv(max(n_seen, 1), p["split_len"])
    return p


def _strides(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.stride())


def _wide(*tensors: torch.Tensor) -> bool:
    return any(s >= WIDE_STRIDE for t in tensors for s in t.stride())


def attention_forward(q, k, v, out, lse, scale: float, causal: bool, causal_offset: int, *,
                      kernel: str | None = None, num_splits: int | None = None) -> None:
    """Fill out (B, Hq, Nq, D) and lse (B, Hq, Nq) with attention of q over k, v (see module doc)."""
    b, hq, n_q, d = q.shape
    n_k = k.shape[2]
    p = plan(q, k, causal, causal_offset, kernel=kernel, num_splits=num_splits)
    upcast = q.dtype == torch.bfloat16 and _checks.triton_interpret()  # see attention_fwd.kv_loop
    common = dict(
        CAUSAL=p["causal"], BLOCK_N=p["BLOCK_N"], HEAD_DIM=d, BLOCK_D=p["BLOCK_D"],
        EVEN_D=p["BLOCK_D"] == d,
        # float32: a true fp32 product (TF32 would break the numerics rule against torch's fp32).
        PRECISION="ieee" if q.dtype == torch.float32 or upcast else "tf32",
        UPCAST=upcast,
        WIDE=_wide(q, k, v, out), num_warps=p["num_warps"], num_stages=p["num_stages"])
    args = (*_strides(q), *_strides(k), *_strides(v), *_strides(out),
            hq, p["group"], n_q, n_k, p["offset"], scale * online.LOG2E, p["m_tiles"])
    with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
        if p["kernel"] == "fwd":
            grid = (b * hq * p["m_tiles"],)
            attention_fwd_kernel[grid](q, k, v, out, lse, *args, BLOCK_M=p["BLOCK_M"], **common)
            return
        splits = p["num_splits"]
        grid = (b * (hq // p["group"]) * p["m_tiles"] * splits,)
        if splits == 1:
            attention_decode_kernel[grid](q, k, v, out, lse, lse, lse, lse, *args, 1, p["split_len"],
                                          SPLIT=False, BLOCK_M=p["BLOCK_M"], **common)
            return
        rows = b * hq * n_q
        part_acc = torch.empty(rows, splits, d, dtype=torch.float32, device=q.device)
        part_m = torch.empty(rows, splits, dtype=torch.float32, device=q.device)
        part_l = torch.empty(rows, splits, dtype=torch.float32, device=q.device)
        attention_decode_kernel[grid](q, k, v, out, lse, part_acc, part_m, part_l, *args, splits,
                                      p["split_len"], SPLIT=True, BLOCK_M=p["BLOCK_M"], **common)
        attention_merge_kernel[(triton.cdiv(rows, p["merge_rows"]),)](
            part_acc, part_m, part_l, out, lse, *_strides(out), rows, hq, n_q, splits,
            BLOCK_R=p["merge_rows"], HEAD_DIM=d, BLOCK_D=p["BLOCK_D"], UPCAST=upcast,
            num_warps=p["merge_warps"])
