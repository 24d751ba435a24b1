"""Launching a Triton kernel from a plan: its compiled kernel, not JIT dispatch on every call.

`kernel[grid](*args, **meta)` (Triton's JIT dispatch) binds the arguments, computes a
specialization key over every one of them, reads Triton's runtime knobs and looks the compiled
kernel up: ~13 µs of host time per call for an empty kernel on the H100 machine, more with many
arguments. A plan fixes the grid, the meta-parameters and every integer argument (they are shapes
and strides, which the plan's signature holds), so the only thing left that selects a
specialization is the 16-byte alignment of the tensor arguments. `Launch` therefore goes through
JIT dispatch once per alignment pattern, keeps the CompiledKernel it returns, and from then on
calls its launcher directly with the arguments Triton would have passed (runtime arguments, then
the constexpr values in signature order) on the current stream of the plan's device.

Not on that path: Triton's launch hooks (knobs.runtime.launch_enter_hook, used by proton) see only
the first launch of each specialization; the interpreter (TRITON_INTERPRET=1) always goes through
`kernel[grid]`.
"""
from __future__ import annotations

import functools
import inspect

import torch
from triton.runtime.jit import _normalize_ty

from .. import _checks
from .._plan import current_device as _current_device
from .._plan import current_stream as _raw_stream

__all__ = ["Launch"]

_ALIGN = 16  # Triton specializes pointer arguments on 16-byte alignment


@functools.lru_cache(maxsize=None)
def _signature(py_fn) -> tuple[int, list]:
    """(index of the first constexpr parameter, the parameters) of a kernel's Python function."""
    params = list(inspect.signature(py_fn).parameters.values())
    constexpr = ["constexpr" in _normalize_ty(p.annotation) if p.annotation is not p.empty else False
                 for p in params]
    first = constexpr.index(True) if True in constexpr else len(params)
    if not all(constexpr[first:]):
        raise AssertionError(f"{py_fn.__name__}: a runtime argument follows a constexpr")
    return first, params


def _address(a) -> int:
    return a.data_ptr() if isinstance(a, torch.Tensor) else a.base.data_ptr()  # TensorDescriptor


class Launch:
    """One kernel with its grid and meta-parameters fixed. `launch(*args)` runs it on the current
    stream; `args` are the kernel's runtime (non-constexpr) arguments in signature order, and the
    integers among them must be the same on every call (the plan's signature guarantees it)."""

    __slots__ = ("fn", "grid", "meta", "device", "_runtime", "_tail", "_compiled", "_pointers", "_interpret")

    def __init__(self, fn, grid: tuple, meta: dict, device: torch.device):
        self.fn, self.meta, self.device = fn, meta, device
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self._interpret = device.type != "cuda" or _checks.triton_interpret()
        self._compiled: dict = {}
        self._pointers: tuple | None = None
        self._runtime, self._tail = self._constexpr_tail(fn, meta)

    @staticmethod
    def _constexpr_tail(fn, meta: dict) -> tuple:
        """(number of runtime arguments, the constexpr values in signature order after them): every
        kernel of this package declares its constexprs last (checked here, as Triton reads
        annotations)."""
        first, params = _signature(fn.fn)
        tail = []
        for p in params[first:]:
            if p.name in meta:
                tail.append(meta[p.name])
            elif p.default is not p.empty:
                tail.append(p.default)
            else:
                raise TypeError(f"{fn.fn.__name__}: no value for constexpr {p.name}")
        return first, tuple(tail)

    def __call__(self, *args) -> None:
        if self._interpret:
            self.fn[self.grid](*args, **self.meta)
            return
        pointers = self._pointers
        if pointers is None:
            pointers = self._pointers = tuple(i for i, a in enumerate(args) if not isinstance(a, (int, float)))
        bits = 0
        for i in pointers:
            bits |= _address(args[i])
        key = True if bits % _ALIGN == 0 else tuple(_address(args[i]) % _ALIGN == 0 for i in pointers)
        compiled = self._compiled.get(key)
        if compiled is None:
            if _current_device() != self.device.index:
                with torch.cuda.device(self.device.index):
                    return self.__call__(*args)
            if len(args) != self._runtime:
                raise TypeError(f"{self.fn.fn.__name__} takes {self._runtime} runtime arguments, got {len(args)}")
            # JIT dispatch: compiles (or finds in Triton's cache) the kernel for this specialization
            # and launches it; its handles serve every later call with the same alignment.
            kernel = self.fn[self.grid](*args, **self.meta)
            self._compiled[key] = (kernel.run, kernel.function, kernel.packed_metadata)
            return
        run, function, packed = compiled
        g, index = self.grid, self.device.index
        if _current_device() != index:
            # The compiled function belongs to its device's context: launch with that one current.
            with torch.cuda.device(index):
                run(g[0], g[1], g[2], _raw_stream(index), function, packed, None, None, None,
                    *args, *self._tail)
            return
        run(g[0], g[1], g[2], _raw_stream(index), function, packed, None, None, None, *args, *self._tail)
