"""ta.attention and ta.scaled_dot_product_attention: validate → dispatch to a backend's forward.

The forward is one torch.library custom op, `tiled_attn::attention_fwd`, so torch.compile traces it
without a graph break. Masking is one integer: with `causal`, query i sees key j iff
j <= i + causal_offset. ta.attention uses offset Nk − Nq (bottom-right, flash-attn ≥ 2.1);
ta.scaled_dot_product_attention uses 0 (torch's top-left `is_causal`).

Backends fill preallocated outputs: `out` is laid out (B, Nq, H, D) in memory and returned as its
(B, H, Nq, D) transpose, so a module's `out.transpose(1, 2).reshape(B, N, H*D)` is free; `lse` is a
contiguous (B, H, Nq) float32 tensor in natural-log units.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import _checks, configs, reference

__all__ = ["attention", "scaled_dot_product_attention"]


def _default_backend(q: torch.Tensor) -> str:
    if q.dtype == torch.float64:
        return "torch"
    return configs.DEFAULT_BACKEND[("attention", q.device.type)]


def _alloc(q: torch.Tensor, v: torch.Tensor):
    b, h, nq, _ = q.shape
    out = torch.empty(b, nq, h, v.shape[-1], dtype=q.dtype, device=q.device).transpose(1, 2)
    lse = torch.empty(b, h, nq, dtype=torch.float32, device=q.device)
    return out, lse


@torch.library.custom_op("tiled_attn::attention_fwd", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool,
                  causal_offset: int, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = (_checks.new_output(t) for t in _alloc(q, v))
    if q.numel() == 0:
        return out, lse
    if k.shape[2] == 0:  # no keys: every row is empty (output 0, lse -inf), nothing to launch
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse
    if backend == "torch":
        o, l = reference.blockwise_attention(q, k, v, causal=causal, scale=scale, return_lse=True,
                                             causal_offset=causal_offset)
        out.copy_(o)
        lse.copy_(l)
    elif backend == "triton":
        from .triton import attention as triton_attention
        triton_attention.attention_forward(q, k, v, out, lse, scale, causal, causal_offset)
    elif backend == "cuda":
        from . import cuda
        cuda.attention_forward(q, k, v, out, lse, scale, causal, causal_offset)
    else:
        raise AssertionError(backend)
    return out, lse


@_attention_op.register_fake
def _(q, k, v, scale, causal, causal_offset, backend):
    return _alloc(q, v)


def _no_backward(ctx, grad_out, grad_lse):
    raise NotImplementedError(
        "tiled_attn.attention has a forward pass only: backward is not implemented yet. For "
        "training, call torch.nn.functional.scaled_dot_product_attention (or "
        "ta.scaled_dot_product_attention, which routes to it when a gradient is needed).")


_attention_op.register_autograd(_no_backward, setup_context=lambda ctx, inputs, output: None)


def _forward(q, k, v, scale, causal, causal_offset, backend):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    backend = backend or _default_backend(q)
    if backend == "cuda":
        from . import cuda
        cuda.require_attention(q)
    return _attention_op(q, k, v, scale, causal, causal_offset, backend)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: float | None = None, return_lse: bool = False, backend: str | None = None):
    """softmax(q kᵀ · scale) v, blocked, with the online softmax fused into the key loop.

    Args:
        q: (B, Hq, Nq, D); k, v: (B, Hkv, Nk, D) with Hq % Hkv == 0 (GQA/MQA by index, never
           repeated). Any Nq, Nk ≥ 0, D ≤ 256, float16/bfloat16/float32, any strides.
        causal: bottom-right aligned like flash-attn ≥ 2.1: query i sees key j iff
           j <= i + Nk − Nq. Rows that see no key (Nq > Nk) give output 0 and lse -inf.
        scale: defaults to 1/sqrt(D).
        return_lse: also return lse (B, Hq, Nq) float32, natural log of Σ_j exp(scale·q·k_j).
        backend: None (fastest measured for the device; "torch" on the CPU), "triton", "cuda",
           "torch" (blockwise online attention in PyTorch).

    Forward only: a backward through it raises NotImplementedError.
    """
    _checks.check_attention(q, k, v, scale, backend)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    out, lse = _forward(q, k, v, scale, causal, k.shape[2] - q.shape[2], backend)
    return (out, lse) if return_lse else out


def _needs_torch_sdpa(query, key, value, attn_mask, dropout_p) -> str | None:
    """Why a call must go to torch's own SDPA, or None when our kernels compute it exactly."""
    if attn_mask is not None:
        return "attn_mask"
    if dropout_p:
        return "dropout_p > 0"
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        return "a gradient is needed (tiled_attn has no attention backward yet)"
    if value.shape[-1] != query.shape[-1] or query.shape[-1] > _checks.MAX_HEAD_DIM:
        return "head dims our kernels do not cover"
    if query.dtype not in _checks.KERNEL_DTYPES:
        return "dtype"
    return None


def _torch_layout(query, key, value, enable_gqa) -> bool:
    """True when torch's broadcasting (matmul) semantics differ from our (B, H, N, D) batching:
    fewer than 3 dims, leading dims that differ (broadcast), k/v shapes that differ before the head
    dim, or heads that differ without enable_gqa other than a single shared k/v head (which torch
    broadcasts, i.e. MQA, which our kernels compute as GQA)."""
    if min(t.dim() for t in (query, key, value)) < 3 or not query.dim() == key.dim() == value.dim():
        return True
    if not query.shape[:-3] == key.shape[:-3] == value.shape[:-3]:
        return True
    if key.shape[:-1] != value.shape[:-1]:
        return True
    hq, hk = query.shape[-3], key.shape[-3]
    return not (hq == hk or hk == 1 or enable_gqa)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention's signature and meaning, on our kernels.

    `is_causal` is top-left aligned, as in torch (query i sees key j iff j <= i). Inputs are
    (..., H, L, E) like torch's. GQA (fewer key/value heads) needs `enable_gqa=True`, as in torch;
    without it, heads that differ raise ValueError unless one side has a single head (torch
    broadcasts it).

    Calls with anything our kernels do not cover go to torch's own SDPA, so the result always has
    torch's meaning: a tensor `attn_mask`, `dropout_p > 0`, inputs that require grad while grad
    is enabled (we have no backward yet), a value head dim different from the query's, a head
    dim over 256, float64, and shapes that only torch's broadcasting gives a meaning to (fewer
    than 3 dims, leading dims of different sizes, a query with one head against several).
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        _checks.check_tensor(name, t)
    if attn_mask is not None and is_causal:
        raise ValueError("attn_mask and is_causal cannot both be set (as in torch)")
    if (not enable_gqa and min(t.dim() for t in (query, key)) >= 3
            and query.shape[-3] != key.shape[-3] and 1 not in (query.shape[-3], key.shape[-3])):
        raise ValueError(f"query has {query.shape[-3]} heads and key {key.shape[-3]}: pass "
                         "enable_gqa=True for grouped-query attention (as in torch)")
    if (_torch_layout(query, key, value, enable_gqa)
            or _needs_torch_sdpa(query, key, value, attn_mask, dropout_p) is not None):
        kwargs = {"enable_gqa": enable_gqa} if enable_gqa else {}
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask,
                                              dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                                              **kwargs)
    batch_shape = query.shape[:-3]
    # An explicit batch size, not -1: a reshape of an empty tensor cannot infer it.
    b = math.prod(batch_shape)
    q, k, v = (t.reshape((b,) + tuple(t.shape[-3:])) for t in (query, key, value))
    _checks.check_attention(q, k, v, scale, None)
    out, _ = _forward(q, k, v, scale, bool(is_causal), 0, None)
    return out.reshape(batch_shape + out.shape[1:])
