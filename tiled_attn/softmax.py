"""ta.softmax: validate → a cached plan → launch (DESIGN §3), with a fused backward.

Every backend sees the same thing: the input as an (M, N) matrix whose rows are the softmax rows
(any row and column strides), and a row-major (M, N) output to fill. Moving `dim` last and flattening
the leading dims is a view for every layout where that is possible (contiguous, transposed,
step-sliced rows, ...); a layout whose leading dims cannot be flattened into one row stride (e.g.
dim=1 of a contiguous 3-D tensor) is copied once into that order first. The output is laid out with
`dim` innermost (rows contiguous) and viewed back to x's shape: its strides are a function of x's
shape and `dim` only, which is what the fake (meta) implementation needs for torch.compile.

One call, eager on a plain tensor (tiled_attn/_plan.py says when a call is that):
    softmax(x, dim)  →  _PLANS[signature]  (a miss: _resolve validates in full, then a plan is made)
                     →  fast_run(plan.fast, x, ...): C++ allocates the output and launches the plan's
                        kernel (csrc/bindings.cpp; once the plan's first launch has compiled it)
                     or SoftmaxPlan.forward(x): allocate the output, run the backend's launches.
With autograd recording, the same plan runs inside `_Softmax`, a torch.autograd.Function whose
backward runs a backward plan (dx = y·(dy − Σ dy·y)). Traced calls (torch.compile, make_fx, ...)
validate and go through the ops `tiled_attn::softmax` / `tiled_attn::softmax_backward`, registered
with torch.library.define + impl + register_fake; their implementations use the same plans.

log_softmax is the same machinery with `log` set: its own plan caches and ops
(`tiled_attn::log_softmax` / `tiled_attn::log_softmax_backward`), the same kernels with a LOG
constexpr in their finalize (the online state's lse: y = (x − m) − ln l) and in the fused backward
(dx = dy − e^y·Σ dy). The CUDA backend has no log kernels: backend="cuda" raises ValueError.

Backends: "triton" and "cuda" (tiled_attn/triton/softmax.py, tiled_attn/cuda/softmax.py: each has a
plan_forward / plan_backward that returns its launches as a function), "torch" (the pure-PyTorch
tiled online algorithm of reference.py) and, for backend=None on the CPU, torch's own softmax: the
same function, and the fastest there (DESIGN §3: None picks the fastest measured for the device).
"""
from __future__ import annotations


import torch

from . import _checks, _plan, configs, reference, softmax_select

__all__ = ["softmax", "log_softmax", "softmax_kernels"]

# The torch backend's kernels: the tiled online algorithm (default) and the classic three passes.
# reference.online_softmax (one column at a time) is a reference for the recurrence, not a backend
# kernel: a sequential sum's O(N·eps) error would fail the numerics rule on long rows.
TORCH_KERNELS = ("tiled", "safe")
# backend=None on the CPU: torch.softmax itself (not a name users pass).
NATIVE = "native"


def _backend_module(backend: str):
    if backend == "triton":
        from .triton import softmax as mod
    elif backend == "cuda":
        from .cuda import softmax as mod
    else:
        raise AssertionError(backend)
    return mod


def softmax_kernels(backend: str) -> list[str]:
    """The kernel names usable as `ta.softmax(..., backend=backend, kernel=NAME)`."""
    if backend == "torch":
        return list(TORCH_KERNELS)
    if backend in ("triton", "cuda"):
        return list(_backend_module(backend).SOFTMAX_KERNELS)
    raise ValueError(f"backend must be one of {', '.join(map(repr, _checks.BACKENDS))}, got {backend!r}")


def _check_kernel(backend: str, kernel: str | None) -> None:
    if kernel is not None and kernel not in softmax_kernels(backend):
        raise ValueError(f"kernel must be one of {softmax_kernels(backend)} for backend={backend!r}, "
                         f"got {kernel!r}")


def _default_backend(x: torch.Tensor) -> str:
    if x.dtype == torch.float64 and x.device.type != "cpu":
        return "torch"
    backend = configs.DEFAULT_BACKEND[("softmax", x.device.type)]
    if backend == "cuda":
        from . import cuda
        if not cuda.is_available():
            return "triton"
    return backend


def _rows(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x as an (M, N) matrix whose rows are the softmax rows: a view when the layout allows."""
    moved = x.movedim(dim, -1)
    n = moved.shape[-1]
    m = moved.numel() // n if n else 0
    if _rows_are_a_view(x, dim):
        return moved.view(m, n)
    return moved.reshape(m, n)  # leading dims not flattenable into one stride: one copy


def _alloc_out(x: torch.Tensor, dim: int) -> torch.Tensor:
    moved_shape = x.movedim(dim, -1).shape
    return torch.empty(moved_shape, dtype=x.dtype, device=x.device).movedim(-1, dim)


def _out_rows(out: torch.Tensor, dim: int) -> torch.Tensor:
    moved = out.movedim(dim, -1)
    n = moved.shape[-1]
    return moved.view(moved.numel() // n if n else 0, n)


def _rows_are_a_view(x: torch.Tensor, dim: int) -> bool:
    """Whether _rows(x, dim) is a view, so that a kernel planned on it can read x itself: the dims
    other than `dim` (those of size > 1) chain into one row stride, as view() requires. Read off the
    sizes and strides, never by trying the view: while torch.compile traces, a failed view of a
    fake tensor aborts the trace instead of raising to the caller."""
    moved = x.movedim(dim, -1)
    if moved.numel() == 0:
        return True
    expected = None
    for size, stride in zip(reversed(moved.shape[:-1]), reversed(moved.stride()[:-1])):
        if size == 1:
            continue
        if expected is not None and stride != expected:
            return False
        expected = stride * size
    return True


# ------------------------------------------------------------------------------------------------
# plans
# ------------------------------------------------------------------------------------------------
def _log_kw(log: bool) -> dict:
    # Only the Triton backend's plan functions take `log` (the CUDA backend has no log kernels).
    return {"log": True} if log else {}


# The C++ launch path (csrc/bindings.cpp fast_run): an eager call whose plan is one Triton launch of
# x into a new output, or one launch of a CUDA ladder kernel (whose pybind11 call cost 16-17 µs of
# host on the H100, 2026-11-27), allocates and launches from C++, and Python keeps only the plan lookup.
# Measured on the H100 (2026-11-27, overhead suite): the Python path cost ta.softmax 11.8-20.4 µs a
# call against torch.softmax's 8.4-13.4; its parts (H200 profile, host/2026-11-26-h200-profile-2.txt)
# were Triton's C launcher 3.95 µs, torch.empty_like 1.66 and our frames ~2.6. It needs the CUDA
# extension (built on first use where a CUDA toolkit is installed: tiled_attn/cuda/_build.py); where
# that cannot be had, or with TILED_ATTN_FAST_LAUNCH=0, every call takes the Python path.
_FAST_LAUNCH = _plan.FAST_LAUNCH
_fast_run = None  # the extension's fast_run, once a plan registered with it
_raw_stream = _plan.current_stream
# Why the C++ path was turned off in this process (a failed build or registration), for tests and users.
fast_launch_off_because: str | None = None


def _fast_extension(device: torch.device):
    """The CUDA extension that registers and runs C++ launches, or None (the Python path runs)."""
    global fast_launch_off_because
    if not _FAST_LAUNCH or fast_launch_off_because is not None:
        return None
    from . import cuda
    if not cuda.is_available():
        fast_launch_off_because = ("the CUDA extension cannot be built here: "
                                   + "; ".join(cuda._build.missing()))
        return None
    try:
        return cuda.load(device)
    except RuntimeError as e:  # a failed build: the Python path still runs every call
        fast_launch_off_because = str(e)
        return None


class SoftmaxPlan:
    """A validated signature's forward: the output's layout and the backend's launches, and once the
    first launch has compiled them, the same launch registered for C++ (`fast`)."""

    __slots__ = ("dim", "backend", "kernel", "log", "size", "stride", "dtype", "device", "run", "copy",
                 "like", "index", "fast", "fast_tries")

    def __init__(self, x: torch.Tensor, dim: int, backend: str, kernel: str | None, log: bool = False):
        self.dim, self.backend, self.kernel, self.log = dim, backend, kernel, log
        out = _alloc_out(x, dim)
        self.size, self.stride, self.dtype, self.device = out.shape, out.stride(), x.dtype, x.device
        # empty_like(x) where it lays the output out as planned (x dense, dim innermost or the same
        # order): 0.5 µs a call cheaper than empty_strided, which parses a size and a stride list
        # (H200 host, 2026-11-26: 3.84 vs 4.33 µs). A plan's x has this signature's strides, so the
        # answer holds for every call that finds the plan.
        self.like = torch.empty_like(x).stride() == self.stride if x.numel() else False
        self.run, self.copy = None, False
        if backend in ("triton", "cuda") and x.numel():
            self.copy = not _rows_are_a_view(x, dim)
            self.run = _backend_module(backend).plan_forward(_rows(x, dim), _out_rows(out, dim), kernel,
                                                             **_log_kw(log))
        self.index, self.fast = x.device.index, None
        # One launch of x itself (no copy into row order first: fast_run launches on x; a Triton
        # kernel or a CUDA ladder kernel without workspace) can go through C++; the tries cover first
        # calls whose x was off the 16-byte grid (Triton's aligned specialization compiles at the
        # first aligned call; fast_run declines misaligned x, whose kernels may take another path).
        self.fast_tries = 3 if (_FAST_LAUNCH and not self.copy and x.is_cuda
                                and hasattr(self.run, "fast_spec")) else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        backend = self.backend
        if backend == NATIVE:
            return torch.log_softmax(x, self.dim) if self.log else torch.softmax(x, self.dim)
        if self.like:
            out = torch.empty_like(x)
        else:
            out = torch.empty_strided(self.size, self.stride, dtype=self.dtype, device=self.device)
        if _checks.POISON_OUTPUTS:
            out.fill_(float("nan"))
        if self.run is not None:
            self.run(_rows(x, self.dim) if self.copy else x, out)
            if self.fast_tries:
                self._register_fast(x, out)
        elif backend == "torch" and x.numel():
            fn = reference.safe_softmax if self.kernel == "safe" else reference.tiled_softmax
            out.copy_(fn(x, self.dim, log=self.log))
        return out

    def _register_fast(self, x: torch.Tensor, out: torch.Tensor) -> None:
        """After a launch through the backend: register that launch for C++ (csrc/bindings.cpp
        fast_register for a Triton kernel, once its aligned specialization is compiled;
        fast_register_softmax for a kernel of the CUDA ladder, from an aligned call)."""
        global _fast_run, fast_launch_off_because
        self.fast_tries -= 1
        spec = self.run.fast_spec()
        cuda_kernel = spec is not None and "softmax_kernel" in spec
        if spec is None or (cuda_kernel and (x.data_ptr() % 16 or out.data_ptr() % 16)):
            return
        self.fast_tries = 0
        ext = _fast_extension(self.device)
        if ext is None:
            return
        from .cuda import _build
        out_layout = (list(self.size), list(self.stride), self.like)
        try:
            if cuda_kernel:
                self.fast = _build.call(ext.fast_register_softmax, spec["softmax_kernel"], _rows(x, self.dim),
                                        _out_rows(out, self.dim), *spec["launch"], *out_layout)
            else:
                self.fast = _build.call(ext.fast_register, spec["function"], spec["grid"], spec["threads"],
                                        spec["shared"], spec["device"], spec["sizes"], spec["values"],
                                        *spec["slots"], *out_layout)
        except (ValueError, TypeError, RuntimeError) as e:  # a launch C++ cannot take: Python keeps it
            fast_launch_off_because = f"fast_register refused a softmax plan: {e}"
            return
        _fast_run = ext.fast_run


class SoftmaxBackwardPlan:
    """dx = y·(dy − Σ dy·y) for one signature of (y, dy); with `log` (y the log-softmax output)
    dx = dy − e^y·Σ dy."""

    __slots__ = ("dim", "backend", "log", "size", "stride", "dtype", "device", "run", "copy_y", "copy_dy")

    def __init__(self, y: torch.Tensor, dy: torch.Tensor, dim: int, backend: str, log: bool = False):
        self.dim, self.backend, self.log = dim, backend, log
        dx = _alloc_out(y, dim)
        self.size, self.stride, self.dtype, self.device = dx.shape, dx.stride(), y.dtype, y.device
        self.run, self.copy_y, self.copy_dy = None, False, False
        if backend in ("triton", "cuda") and y.numel():
            # y is the forward's output (rows contiguous) under autograd; the op may get any layout.
            self.copy_y, self.copy_dy = not _rows_are_a_view(y, dim), not _rows_are_a_view(dy, dim)
            self.run = _backend_module(backend).plan_backward(_rows(y, dim), _rows(dy, dim),
                                                              _out_rows(dx, dim), **_log_kw(log))

    def backward(self, y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        dx = torch.empty_strided(self.size, self.stride, dtype=self.dtype, device=self.device)
        if _checks.POISON_OUTPUTS:
            dx.fill_(float("nan"))
        if self.run is not None:
            dim = self.dim
            self.run(_rows(y, dim) if self.copy_y else y, _rows(dy, dim) if self.copy_dy else dy, dx)
        elif y.numel():
            dx.copy_(reference.softmax_backward(y, dy, self.dim, log=self.log))
        return dx


# One cache per op (the op is part of a plan's signature, DESIGN §3): softmax's own lookups keep
# their key.
_PLANS = _plan.PlanCache("softmax")
_BACKWARD_PLANS = _plan.PlanCache("softmax_backward")
_LOG_PLANS = _plan.PlanCache("log_softmax")
_LOG_BACKWARD_PLANS = _plan.PlanCache("log_softmax_backward")


def _resolve(x, dim, backend, kernel, log: bool = False) -> tuple[int, str]:
    """Validate (DESIGN §5) and pick the backend: (dim made non-negative, backend)."""
    if log and backend == "cuda":
        raise ValueError("backend='cuda' has no log_softmax kernels (csrc/softmax computes softmax "
                         "only); use backend=None or 'triton' (or 'torch')")
    dim = _checks.check_softmax(x, dim, backend, kernel)
    if backend is not None:
        _check_kernel(backend, kernel)
    elif x.device.type == "cpu" or x.dtype == torch.float64:
        # torch's own softmax: the same function, the fastest on the CPU (our kernels run there
        # only in Triton's interpreter), and the only float64 one on a GPU.
        backend = NATIVE
    else:
        backend = _default_backend(x)
        if log and backend == "cuda":
            backend = "triton"  # the CUDA backend has no log kernels
    return dim, backend


def _pick(x, dim, backend, kernel, log: bool = False) -> tuple[int, str, str | None]:
    """_resolve, then backend=None's kernel on CUDA: the measured choice of softmax_select.py
    (configs.SOFTMAX_SELECT; today's choice where it has no row). Symbolic shapes (torch.compile
    with dynamic shapes) keep today's choice rather than guard on the table's bounds."""
    dim, chosen = _resolve(x, dim, backend, kernel, log)
    if backend is None and chosen in ("triton", "cuda") and x.dim() and all(type(s) is int for s in x.shape):
        # rows copied into order first are read with unit column stride
        chosen, kernel = softmax_select.for_tensor(x, dim, log, None if _rows_are_a_view(x, dim) else True)
    return dim, chosen, kernel


def _plan_for(x: torch.Tensor, dim: int, backend: str | None, kernel: str | None, log: bool = False):
    """The plan of this call's signature (x a plain tensor of >= 1 dim, dim an int): a hit means
    the same signature was validated before; a miss validates and plans."""
    cache = _LOG_PLANS if log else _PLANS
    key = (x.shape, x.stride(), x.dtype, x.device, dim, backend, kernel)
    try:
        plan = cache.get(key)
    except TypeError:  # an unhashable argument: validation names it
        key = plan = None
    if plan is None:
        dim_, backend_, kernel_ = _pick(x, dim, backend, kernel, log)
        plan = cache.put(key, SoftmaxPlan(x, dim_, backend_, kernel_, log))
    return plan


def _backward_plan_for(y: torch.Tensor, dy: torch.Tensor, dim: int, backend: str, log: bool = False):
    cache = _LOG_BACKWARD_PLANS if log else _BACKWARD_PLANS
    key = (y.shape, y.stride(), y.dtype, y.device, dy.shape, dy.stride(), dy.dtype, dy.device, dim, backend)
    plan = cache.get(key)
    if plan is None:
        if dy.shape != y.shape or dy.dtype != y.dtype or dy.device != y.device:
            raise ValueError(f"dy must match y (shape {tuple(y.shape)}, {y.dtype}, {y.device}), got "
                             f"{tuple(dy.shape)}, {dy.dtype}, {dy.device}")
        plan = cache.put(key, SoftmaxBackwardPlan(y, dy, dim, backend, log))
    return plan


# ------------------------------------------------------------------------------------------------
# ops (for tracing) and autograd
# ------------------------------------------------------------------------------------------------
torch.library.define("tiled_attn::softmax", "(Tensor x, int dim, str backend, str kernel) -> Tensor")
torch.library.define("tiled_attn::softmax_backward",
                     "(Tensor y, Tensor dy, int dim, str backend) -> Tensor")


@torch.library.impl("tiled_attn::softmax", "CompositeExplicitAutograd")
def _softmax_impl(x, dim, backend, kernel):
    return _plan_for(x, dim, backend, kernel or None).forward(x)


@torch.library.register_fake("tiled_attn::softmax")
def _(x, dim, backend, kernel):
    return _alloc_out(x, dim)


@torch.library.impl("tiled_attn::softmax_backward", "CompositeExplicitAutograd")
def _softmax_backward_impl(y, dy, dim, backend):
    return _backward_plan_for(y, dy, dim, backend).backward(y, dy)


@torch.library.register_fake("tiled_attn::softmax_backward")
def _(y, dy, dim, backend):
    return _alloc_out(y, dim)


torch.library.define("tiled_attn::log_softmax", "(Tensor x, int dim, str backend, str kernel) -> Tensor")
torch.library.define("tiled_attn::log_softmax_backward",
                     "(Tensor y, Tensor dy, int dim, str backend) -> Tensor")


@torch.library.impl("tiled_attn::log_softmax", "CompositeExplicitAutograd")
def _log_softmax_impl(x, dim, backend, kernel):
    return _plan_for(x, dim, backend, kernel or None, True).forward(x)


@torch.library.register_fake("tiled_attn::log_softmax")
def _(x, dim, backend, kernel):
    return _alloc_out(x, dim)


@torch.library.impl("tiled_attn::log_softmax_backward", "CompositeExplicitAutograd")
def _log_softmax_backward_impl(y, dy, dim, backend):
    return _backward_plan_for(y, dy, dim, backend, True).backward(y, dy)


@torch.library.register_fake("tiled_attn::log_softmax_backward")
def _(y, dy, dim, backend):
    return _alloc_out(y, dim)


_softmax_op = torch.ops.tiled_attn.softmax.default
_softmax_backward_op = torch.ops.tiled_attn.softmax_backward.default
_log_softmax_op = torch.ops.tiled_attn.log_softmax.default
_log_softmax_backward_op = torch.ops.tiled_attn.log_softmax_backward.default


def _forward(x, dim, backend, kernel, log=False):
    if type(x) is torch.Tensor and _plan.eager():
        return _plan_for(x, dim, backend, kernel, log).forward(x)
    return (_log_softmax_op if log else _softmax_op)(x, dim, backend, kernel or "")


def _backward(y, dy, dim, backend, log=False):
    if type(y) is torch.Tensor and type(dy) is torch.Tensor and _plan.eager():
        return _backward_plan_for(y, dy, dim, backend, log).backward(y, dy)
    return (_log_softmax_backward_op if log else _softmax_backward_op)(y, dy, dim, backend)


class _Softmax(torch.autograd.Function):
    """y = softmax(x) with the fused backward dx = y·(dy − Σ dy·y) on the same backend; with
    `log`, y = log_softmax(x) and dx = dy − e^y·Σ dy."""

    @staticmethod
    def forward(ctx, x, dim, backend, kernel, log=False):
        y = _forward(x, dim, backend, kernel, log)
        ctx.save_for_backward(y)
        ctx.dim, ctx.backend, ctx.log = dim, backend, log
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return _backward(y, dy, ctx.dim, ctx.backend, ctx.log), None, None, None, None


def softmax(x: torch.Tensor, dim: int = -1, *, backend: str | None = None,
            kernel: str | None = None) -> torch.Tensor:
    """Softmax of `x` along `dim`, computed with the online (running max/sum) algorithm.

    Args:
        x: float32, float16 or bfloat16 (float64 on backend="torch"), any shape, strides or size,
           including empty tensors and rows of tens of millions of columns.
        dim: the reduction dim (negative counts from the end).
        backend: None (the fastest measured for the device: "triton" on CUDA, torch.softmax itself
           on the CPU and for float64), "triton", "cuda" or "torch" (pure PyTorch, tiled online
           algorithm: the reference).
        kernel: one of `softmax_kernels(backend)` to pin a kernel, e.g. a baseline of the ladder.

    Returns a tensor of x's shape and dtype (accumulation in float32). Differentiable: the
    backward is the fused dx = y·(dy − Σ dy·y) on the same backend. A row of only -inf, or any
    +inf/NaN in a row, gives NaN for that row, as torch.softmax does.
    """
    if type(x) is torch.Tensor and type(dim) is int and x.ndim and _plan.eager():
        try:  # _plan_for's lookup, inline: a frame is a sizeable part of a small call's host time
            plan = _PLANS.get((x.shape, x.stride(), x.dtype, x.device, dim, backend, kernel))
        except TypeError:
            plan = None
        if plan is None:
            plan = _plan_for(x, dim, backend, kernel)
        if plan.backend == NATIVE or not (x.requires_grad and torch.is_grad_enabled()):
            if plan.fast is not None:  # C++ allocates and launches (None: it declined this call)
                out = _fast_run(plan.fast, x, _raw_stream(plan.index), _checks.POISON_OUTPUTS)
                if out is not None:
                    return out
            return plan.forward(x)
        return _Softmax.apply(x, dim, plan.backend, plan.kernel)
    # Traced (torch.compile, make_fx, a functorch transform), a tensor subclass, or a 0-dim x.
    dim, backend, kernel = _pick(x, dim, backend, kernel)
    if backend == NATIVE:
        return torch.softmax(x, dim)
    if x.dim() == 0:  # the softmax of one element, through the 1-element row
        return softmax(x.reshape(1), 0, backend=backend, kernel=kernel).reshape(())
    if x.requires_grad and torch.is_grad_enabled():
        return _Softmax.apply(x, dim, backend, kernel)
    return _softmax_op(x, dim, backend, kernel or "")


def log_softmax(x: torch.Tensor, dim: int = -1, *, backend: str | None = None,
                kernel: str | None = None) -> torch.Tensor:
    """Log-softmax of `x` along `dim`: x − m − log Σ exp(x − m), natural log, from the same online
    state and kernels as `softmax` (one more finalize: (x − m) − log l).

    Arguments, dtypes, layouts, sizes and plan caching as `softmax`. backend=None: "triton" on CUDA,
    torch.log_softmax itself on the CPU and for float64; backend="cuda" raises ValueError (no log
    kernels in csrc/). Returns a tensor of x's shape and dtype (accumulation in float32).
    Differentiable: the fused backward dx = dy − exp(y)·Σ dy on the same backend. Exactly
    torch.log_softmax's special values: a -inf entry gives -inf (when its row has a finite entry);
    a row of only -inf, or any +inf/NaN in a row, gives NaN for that row.
    """
    if type(x) is torch.Tensor and type(dim) is int and x.ndim and _plan.eager():
        try:
            plan = _LOG_PLANS.get((x.shape, x.stride(), x.dtype, x.device, dim, backend, kernel))
        except TypeError:
            plan = None
        if plan is None:
            plan = _plan_for(x, dim, backend, kernel, True)
        if plan.backend == NATIVE or not (x.requires_grad and torch.is_grad_enabled()):
            if plan.fast is not None:  # C++ allocates and launches (None: it declined this call)
                out = _fast_run(plan.fast, x, _raw_stream(plan.index), _checks.POISON_OUTPUTS)
                if out is not None:
                    return out
            return plan.forward(x)
        return _Softmax.apply(x, dim, plan.backend, plan.kernel, True)
    # Traced (torch.compile, make_fx, a functorch transform), a tensor subclass, or a 0-dim x.
    dim, backend, kernel = _pick(x, dim, backend, kernel, True)
    if backend == NATIVE:
        return torch.log_softmax(x, dim)
    if x.dim() == 0:  # the log-softmax of one element, through the 1-element row
        return log_softmax(x.reshape(1), 0, backend=backend, kernel=kernel).reshape(())
    if x.requires_grad and torch.is_grad_enabled():
        return _Softmax.apply(x, dim, backend, kernel, True)
    return _log_softmax_op(x, dim, backend, kernel or "")
