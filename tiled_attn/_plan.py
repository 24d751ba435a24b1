"""The cost of a call (DESIGN §3): validate → a cached plan → launch.

A *plan* is everything about a call that its signature decides: the backend and kernel, the launch
configs, grids, split counts, workspace sizes, the output's size and strides, the compiled kernel
handles. It is made once per signature by an op's planner (tiled_attn/softmax.py,
tiled_attn/attention.py, and per backend tiled_attn/triton/*.py, tiled_attn/cuda/*.py), which is
also where the extension is loaded, device properties are read and config tables are looked up.

The signature (a PlanCache key) holds every argument property that validation checks or a planner
reads: shapes, strides, dtypes, devices, flags, the backend and kernel names, with the types of the
scalar arguments where a wrong type would hash like a right one (True == 1 == 1.0). So a cache hit
proves that an identical call was validated and planned before, and a hit costs one tuple and one
dict lookup; a miss validates in full (DESIGN §5) and plans.

Eager calls on plain tensors take that path directly. Anything else (torch.compile's tracing, a
dispatch mode such as FakeTensorMode or make_fx, a functorch transform, a tensor subclass) goes
through the ops registered with torch.library, whose fake implementations give the tracer shapes.
"""
from __future__ import annotations

import functools
import os

import torch

__all__ = ["PlanCache", "eager", "eager_only", "clear_all", "current_stream", "current_device", "FAST_LAUNCH"]

# The C++ launch paths of planned calls (csrc/bindings.cpp fast_run for the softmax, attention_bwd_fast
# for the wgmma attention backward): TILED_ATTN_FAST_LAUNCH=0 keeps every call on the Python path.
FAST_LAUNCH = os.environ.get("TILED_ATTN_FAST_LAUNCH", "1") != "0"

_CACHES: list["PlanCache"] = []


class PlanCache(dict):
    """signature -> plan, bounded: past `limit` entries the oldest is dropped (a decode loop whose
    key length grows by one each step would otherwise keep every step's plan)."""

    def __init__(self, name: str, limit: int = 1024, clear_all: bool = True):
        super().__init__()
        self.name, self.limit = name, limit
        if clear_all:  # clear_all() forgets it too
            _CACHES.append(self)

    def put(self, key, plan):
        if key is not None:
            if len(self) >= self.limit:
                del self[next(iter(self))]
            self[key] = plan
        return plan


def clear_all() -> None:
    """Forget every plan (after a config table or configs.arch changes, e.g. in tests)."""
    for cache in _CACHES:
        cache.clear()


_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_functorch_level = torch._C._functorch.peek_interpreter_stack


def eager() -> bool:
    """True when a call's tensors are real and nothing is tracing it: then it may launch from a
    plan directly. (Callers check `type(t) is torch.Tensor` themselves: a subclass — FakeTensor,
    FunctionalTensor, DTensor, nn.Parameter — takes the op path.)"""
    return not _is_compiling() and not _dispatch_modes() and _functorch_level() is None


def eager_only(fn):
    """`fn` never traced by torch.compile (a graph break there; fn runs eagerly), at no cost to an
    eager call. torch.compiler.disable alone gives the graph break but wraps every call, eager ones
    too, in a swap of Python's frame-evaluation callback (~5 µs a call on the H100 host under
    cProfile, 2026-11-24: as much as the rest of a KV-cache decode call's Python); Dynamo folds
    is_compiling() to True while it traces, so only traced calls take the disabled function."""
    disabled = torch.compiler.disable(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if _is_compiling():
            return disabled(*args, **kwargs)
        return fn(*args, **kwargs)
    return call


try:  # what Triton's own launcher uses: no Stream object per call
    from torch._C import _cuda_getCurrentRawStream as current_stream
    from torch._C import _cuda_getDevice as current_device
except ImportError:  # a CPU-only build of torch: nothing launches on a GPU
    def current_stream(index: int) -> int:
        return torch.cuda.current_stream(index).cuda_stream

    def current_device() -> int:
        return torch.cuda.current_device()
