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


def arch(device: torch.device) -> str:
    """'sm90' for an H100, 'cpu' for tensors the Triton interpreter runs."""
    if device.type != "cuda":
        return "cpu"
    return _arch_of(device.index if device.index is not None else torch.cuda.current_device())


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


# ---------------------------------------------------------------------------------------------
# Default backend per op and device (DESIGN §3: None picks the fastest measured for the device).
# ---------------------------------------------------------------------------------------------
DEFAULT_BACKEND = {
    # (op, device type): backend
    ("softmax", "cpu"): "torch",
    ("softmax", "cuda"): "triton",
    ("attention", "cpu"): "torch",
    ("attention", "cuda"): "triton",
}

# ---------------------------------------------------------------------------------------------
# Triton softmax (tiled_attn/triton/softmax.py) — owned by that module's author.
# ---------------------------------------------------------------------------------------------
TRITON_SOFTMAX: dict = {}

# ---------------------------------------------------------------------------------------------
# CUDA softmax ladder (csrc/softmax/, tiled_attn/cuda/) — owned by that module's author.
# ---------------------------------------------------------------------------------------------
CUDA_SOFTMAX: dict = {}

# ---------------------------------------------------------------------------------------------
# Triton attention (tiled_attn/triton/attention.py) — owned by that module's author.
# ---------------------------------------------------------------------------------------------
TRITON_ATTENTION: dict = {}

# ---------------------------------------------------------------------------------------------
# CUDA attention (csrc/attention/) — owned by that module's author.
# ---------------------------------------------------------------------------------------------
CUDA_ATTENTION: dict = {}
