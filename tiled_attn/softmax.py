"""ta.softmax: validate → choose backend/kernel → a torch.library custom op with a fused backward.

Every backend sees the same thing: a 2-D (M, N) view of the input whose rows are the softmax rows
(any row and column strides), and a row-major (M, N) output to fill. Moving `dim` last and flattening
the leading dims is a view for every layout where that is possible (contiguous, transposed,
step-sliced rows, ...); a layout whose leading dims cannot be flattened into one row stride (e.g.
dim=1 of a contiguous 3-D tensor) is copied once into that order first.

The output is laid out with `dim` innermost (rows contiguous), then viewed back to x's shape; its
strides are a function of x's shape and `dim` only, which is what the fake (meta) implementation
needs for torch.compile.
"""
from __future__ import annotations

import torch

from . import _checks, configs, reference

__all__ = ["softmax", "softmax_kernels"]

# The torch backend's kernels: the tiled online algorithm (default) and the classic three passes.
# reference.online_softmax (one column at a time) is a reference for the recurrence, not a backend
# kernel: a sequential sum's O(N·eps) error would fail the numerics rule on long rows.
TORCH_KERNELS = ("tiled", "safe")


def _backend_module(backend: str):
    if backend == "triton":
        from .triton import softmax as mod
    elif backend == "cuda":
        from . import cuda as mod
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
    backend = configs.DEFAULT_BACKEND[("softmax", x.device.type)]
    if x.dtype == torch.float64:
        return "torch"
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
    try:
        return moved.view(m, n)
    except RuntimeError:
        return moved.reshape(m, n)  # leading dims not flattenable into one stride: one copy


def _alloc_out(x: torch.Tensor, dim: int) -> torch.Tensor:
    moved_shape = x.movedim(dim, -1).shape
    return torch.empty(moved_shape, dtype=x.dtype, device=x.device).movedim(-1, dim)


def _new_out(x: torch.Tensor, dim: int) -> torch.Tensor:
    return _checks.new_output(_alloc_out(x, dim))


def _out_rows(out: torch.Tensor, dim: int) -> torch.Tensor:
    moved = out.movedim(dim, -1)
    n = moved.shape[-1]
    return moved.view(moved.numel() // n if n else 0, n)


def _forward(x: torch.Tensor, dim: int, backend: str, kernel: str) -> torch.Tensor:
    kernel = kernel or None
    if backend == "torch":
        fn = {"tiled": reference.tiled_softmax, "safe": reference.safe_softmax}[kernel or "tiled"]
        out = _new_out(x, dim)
        if x.numel():
            out.copy_(fn(x, dim))
        return out
    out = _new_out(x, dim)
    if x.numel():
        _backend_module(backend).softmax_forward(_rows(x, dim), _out_rows(out, dim), kernel)
    return out


def _backward(y: torch.Tensor, dy: torch.Tensor, dim: int, backend: str) -> torch.Tensor:
    if backend == "torch":
        dx = _new_out(y, dim)
        if y.numel():
            dx.copy_(reference.softmax_backward(y, dy, dim))
        return dx
    dx = _new_out(y, dim)
    if y.numel():
        _backend_module(backend).softmax_backward(_rows(y, dim), _rows(dy, dim), _out_rows(dx, dim))
    return dx


@torch.library.custom_op("tiled_attn::softmax", mutates_args=())
def _softmax_op(x: torch.Tensor, dim: int, backend: str, kernel: str) -> torch.Tensor:
    return _forward(x, dim, backend, kernel)


@_softmax_op.register_fake
def _(x, dim, backend, kernel):
    return _alloc_out(x, dim)


@torch.library.custom_op("tiled_attn::softmax_backward", mutates_args=())
def _softmax_backward_op(y: torch.Tensor, dy: torch.Tensor, dim: int, backend: str) -> torch.Tensor:
    return _backward(y, dy, dim, backend)


@_softmax_backward_op.register_fake
def _(y, dy, dim, backend):
    return _alloc_out(y, dim)


def _setup_context(ctx, inputs, output):
    _, dim, backend, _ = inputs
    ctx.save_for_backward(output)
    ctx.dim, ctx.backend = dim, backend


def _backward_rule(ctx, grad):
    (y,) = ctx.saved_tensors
    return _softmax_backward_op(y, grad, ctx.dim, ctx.backend), None, None, None


_softmax_op.register_autograd(_backward_rule, setup_context=_setup_context)


def softmax(x: torch.Tensor, dim: int = -1, *, backend: str | None = None,
            kernel: str | None = None) -> torch.Tensor:
    """Softmax of `x` along `dim`, computed with the online (running max/sum) algorithm.

    Args:
        x: float32, float16 or bfloat16 (float64 on backend="torch"), any shape, strides or size,
           including empty tensors and rows of tens of millions of columns.
        dim: the reduction dim (negative counts from the end).
        backend: None (fastest measured for the device: "torch" on the CPU), "triton", "cuda"
           or "torch" (pure PyTorch, tiled online algorithm).
        kernel: one of `softmax_kernels(backend)` to pin a kernel, e.g. a baseline of the ladder.

    Returns a tensor of x's shape and dtype (accumulation in float32). Differentiable: the
    backward is the fused dx = y·(dy − Σ dy·y) on the same backend. A row of only -inf, or any
    +inf/NaN in a row, gives NaN for that row, as torch.softmax does.
    """
    dim = _checks.check_softmax(x, dim, backend, kernel)
    if backend is not None:
        _check_kernel(backend, kernel)
    if x.dim() == 0:
        return softmax(x.reshape(1), 0, backend=backend, kernel=kernel).reshape(())
    backend = backend or _default_backend(x)
    if backend == "cuda":
        from . import cuda
        cuda.require()
    return _softmax_op(x, dim, backend, kernel or "")
