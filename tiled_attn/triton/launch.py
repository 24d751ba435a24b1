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

It calls the launcher's module function itself (CudaLauncher.__call__ without its Python wrapper,
which only allocates Triton's global/profile scratch buffers: none of our kernels uses them, checked
at the first launch). Not on that path: Triton's launch hooks (knobs.runtime.launch_enter_hook, used
by proton) see only the first launch of each specialization; the interpreter (TRITON_INTERPRET=1)
always goes through `kernel[grid]`.

Tensors reach the launcher as their device addresses (ints). Given a tensor, Triton's C launcher
calls its `data_ptr()` method and then asks the driver whether the address is device memory
(cuPointerGetAttribute, a driver call per pointer argument per launch); given an int it takes the
address as it is. The alignment check already read every address, and a plan's validation checked
that every tensor is on the plan's CUDA device (DESIGN §5), so the driver's check would only repeat
it.
"""
from __future__ import annotations

import functools
import inspect
import struct

import torch
from triton._C.libtriton import native_specialize_impl
from triton.runtime.jit import _normalize_ty

from .._plan import current_device as _current_device
from .._plan import current_stream as _raw_stream

__all__ = ["Launch"]

_ALIGN = 16  # Triton specializes pointer arguments on 16-byte alignment
# The integer parameter types of Triton's signatures and the bytes its launcher passes them in
# (triton/backends/nvidia/driver.py ty_to_cpp).
_INT_BYTES = {"i1": 1, "u1": 1, "i8": 1, "u8": 1, "i16": 2, "u16": 2, "i32": 4, "u32": 4, "i64": 8, "u64": 8}
_data_ptr = torch.Tensor.data_ptr


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


# (kernel, device, meta-parameters, Triton's specialization of every runtime argument) -> compiled
# handles, shared by every Launch: a new plan (a decode loop makes one per step, for a key length
# one longer) finds the kernel an earlier plan compiled for the same specialization here, without
# JIT dispatch. The specialization is Triton's own (native_specialize_impl, as its binder calls
# it), so an entry is exactly the kernel Triton's cache would return.
_SHARED: dict = {}


def interpreted(fn) -> bool:
    """Whether `fn` runs in Triton's CPU interpreter (its module was imported under
    TRITON_INTERPRET=1: @triton.jit then makes an InterpretedFunction). No environment read per call."""
    return not hasattr(fn, "device_caches")


@functools.lru_cache(maxsize=None)
def _flags(fn) -> tuple | None:
    """Per runtime parameter, the (is_const, specialize, align) Triton's binder passes to
    native_specialize_impl; None when a parameter carries a type annotation (the binder then
    rewrites the result, which _specialization does not)."""
    first, _ = _signature(fn.fn)
    params = fn.params[:first]
    if any(p.annotation_type for p in params):
        return None
    return tuple((p.is_const, not p.do_not_specialize, not p.do_not_specialize_on_alignment) for p in params)


def _specialization(fn, index: int, args) -> tuple | None:
    """Triton's specialization of the runtime arguments, as its binder computes it."""
    flags = _flags(fn)
    if flags is None or not all(isinstance(a, (torch.Tensor, int, float)) for a in args):
        return None  # a tensor descriptor, say: JIT dispatch decides
    backend = fn.device_caches[index][3]
    return tuple(native_specialize_impl(backend, a, c, s, al) for a, (c, s, al) in zip(args, flags))


class Launch:
    """One kernel with its grid and meta-parameters fixed. `launch(*args)` runs it on the current
    stream; `args` are the kernel's runtime (non-constexpr) arguments in signature order, and the
    integers among them must be the same on every call (the plan's signature guarantees it).
    `checked`: the positions of the tensor arguments whose alignment can differ between calls
    (default: every tensor); tensors the plan allocates itself are always aligned."""

    __slots__ = ("fn", "grid", "meta", "device", "_runtime", "_tail", "_compiled", "_checked",
                 "_tensors", "_interpret", "_meta_key", "ready")

    def __init__(self, fn, grid: tuple, meta: dict, device: torch.device, checked: tuple | None = None):
        self.fn, self.meta, self.device = fn, meta, device
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self._interpret = interpreted(fn)
        if not self._interpret and device.type != "cuda":
            # Validation keeps such calls out (DESIGN §5); a plan made past it would retry its
            # device switch forever instead of launching.
            raise ValueError(f"{fn.fn.__name__}: the Triton backend runs on CUDA tensors (or in Triton's "
                             f"interpreter, TRITON_INTERPRET=1), got tensors on {device}")
        self._compiled: dict = {}
        self._checked = checked
        self._tensors: tuple | None = None  # positions of the tensor arguments (first call)
        # The handles of the all-aligned specialization once compiled (Bound's fast path).
        self.ready: tuple | None = None
        self._runtime, self._tail = self._constexpr_tail(fn, meta)
        self._meta_key = tuple(sorted(meta.items()))

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
        tensors = self._tensors
        if tensors is None:
            tensors = self._tensors = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
            if self._checked is None:
                self._checked = tensors
        flat = list(args)
        for i in tensors:  # addresses, not tensors: see the module doc
            flat[i] = flat[i].data_ptr()
        checked = self._checked
        bits = 0
        for i in checked:
            bits |= flat[i]
        key = True if bits % _ALIGN == 0 else tuple(flat[i] % _ALIGN == 0 for i in checked)
        compiled = self._compiled.get(key)
        index = self.device.index
        if compiled is None or _current_device() != index:
            self._slow(key, args)
            return
        launch, function, packed, coop, pdl, _ = compiled
        g = self.grid
        launch(g[0], g[1], g[2], _raw_stream(index), function, coop, pdl, None, None, packed, None, None,
               None, *flat, *self._tail)

    def _slow(self, key, args) -> None:
        """The first launch of a specialization (JIT dispatch), or a launch from another current
        device (the compiled function belongs to its device's context)."""
        if _current_device() != self.device.index:
            with torch.cuda.device(self.device.index):
                self(*args)
            return
        if len(args) != self._runtime:
            raise TypeError(f"{self.fn.fn.__name__} takes {self._runtime} runtime arguments, got {len(args)}")
        spec = _specialization(self.fn, self.device.index, args)
        shared_key = None if spec is None else (self.fn, self.device.index, self._meta_key, spec)
        handles = _SHARED.get(shared_key) if shared_key is not None else None
        types = None if spec is None else tuple(s[0] for s in spec)
        if handles is not None:
            self._keep(key, handles)
            self(*args)
            return
        # JIT dispatch: compiles (or finds in Triton's cache) the kernel for this specialization
        # and launches it; its handles serve every later call with the same alignment.
        kernel = self.fn[self.grid](*args, **self.meta)
        launcher = kernel.run  # triton/backends/nvidia/driver.py CudaLauncher
        if launcher.global_scratch_size or launcher.profile_scratch_size:
            raise NotImplementedError(f"{self.fn.fn.__name__} needs Triton's scratch memory: Launch does "
                                      "not allocate it")
        # CudaLauncher.__call__ without its Python wrapper: the module's launch function with no
        # scratch buffers (checked above) and no launch hooks.
        handles = (launcher.launch, kernel.function, kernel.packed_metadata,
                   launcher.launch_cooperative_grid, launcher.launch_pdl, types)
        self._keep(key, handles)
        if shared_key is not None:
            _SHARED[shared_key] = handles

    def _keep(self, key, handles) -> None:
        self._compiled[key] = handles
        if key is True:
            self.ready = handles

    def params(self, args) -> tuple | None:
        """(bytes, value) of each kernel parameter as Triton's launcher packs them for `args` (the
        runtime arguments; a tensor or None where the address is filled per launch), or None where that is
        not known or not plain: the all-aligned specialization not compiled yet, or an argument
        other than a pointer, an integer or a float32 (passed as its bits). Triton drops the arguments it specialized to constants
        (an integer equal to 1: type "constexpr") and appends its global and profile scratch
        pointers (null: _slow checked that the kernel uses neither)."""
        ready = self.ready
        if ready is None or ready[5] is None or len(args) != self._runtime:
            return None
        packed = []
        for ty, arg in zip(ready[5], args):
            if ty == "constexpr":
                continue
            if ty.startswith("*"):  # an address: 8 bytes
                packed.append((8, None if isinstance(arg, torch.Tensor) else arg))
            elif ty in _INT_BYTES and type(arg) is int:
                packed.append((_INT_BYTES[ty], arg))
            elif ty in ("fp32", "f32") and type(arg) is float:  # its float32 bits, as pack_fp32 passes it
                packed.append((4, struct.unpack("<I", struct.pack("<f", arg))[0]))
            else:
                return None
        return (*packed, (8, 0), (8, 0))

    def bind(self, *ints) -> "Bound":
        """This launch with its trailing non-pointer arguments fixed: a call passes the pointers."""
        return Bound(self, ints)


class Bound:
    """A Launch whose arguments after the leading tensors are fixed by the plan. `bound(*tensors)`
    launches; once the all-aligned specialization is compiled it calls the launcher's module
    function directly (one Python frame between a plan and the launch: the host time of a
    small call is mostly such frames)."""

    __slots__ = ("launch", "ints", "_args")

    def __init__(self, launch: Launch, ints: tuple):
        self.launch, self.ints = launch, ints
        self._args = ints + launch._tail

    def __call__(self, *tensors) -> None:
        launch = self.launch
        ready = launch.ready
        index = launch.device.index
        if ready is not None and _current_device() == index:
            ptrs = tuple(map(_data_ptr, tensors))
            bits = 0
            for p in ptrs:
                bits |= p
            if bits % _ALIGN == 0:
                g = launch.grid
                ready[0](g[0], g[1], g[2], _raw_stream(index), ready[1], ready[3], ready[4], None, None,
                         ready[2], None, None, None, *ptrs, *self._args)
                return
        launch(*tensors, *self.ints)

    def fast_spec(self, tensors: int = 2) -> dict | None:
        """What csrc/bindings.cpp fast_register needs to launch this kernel from C++ exactly as
        Triton's launcher would, for a call whose first `tensors` arguments are tensors (their
        addresses set per launch); None until the all-aligned specialization is compiled (the first
        aligned call), or for a launch the C++ path does not take (a cooperative, PDL or cluster
        launch, an argument neither a pointer nor an integer)."""
        launch = self.launch
        ready = launch.ready
        if ready is None:
            return None
        num_warps, num_ctas, shared = ready[2]
        params = launch.params((None,) * tensors + self.ints)
        if params is None or num_ctas != 1 or ready[3] or ready[4]:
            return None
        return dict(function=ready[1], grid=list(launch.grid), threads=32 * num_warps, shared=shared,
                    device=launch.device.index, sizes=[b for b, _ in params],
                    values=[0 if v is None else v for _, v in params], slots=list(range(tensors)))

    def fast_kernel(self, entries: list) -> tuple | None:
        """This launch as csrc/bindings.cpp attention_bwd_fast_register takes a kernel: (function,
        grid, threads, shared, sizes, values, table entries), the leading len(entries) parameters
        being tensors whose addresses a call takes from those entries of its table (the rest: -1);
        None where fast_spec is."""
        spec = self.fast_spec(tensors=len(entries))
        if spec is None:
            return None
        table = list(entries) + [-1] * (len(spec["sizes"]) - len(entries))
        return (spec["function"], spec["grid"], spec["threads"], spec["shared"], spec["sizes"], spec["values"],
                table)
