"""Modules for transformer code: `Attention`, multi-head self-attention on tiled_attn's kernels."""
from __future__ import annotations

import torch
from einops import rearrange
from torch import nn

from . import _checks
from .attention import attention

__all__ = ["Attention", "rotary_tables", "apply_rotary"]


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def rotary_tables(length: int, head_dim: int, theta: float, dtype: torch.dtype, device) -> tuple:
    """cos, sin of shape (length, head_dim) for RoPE, in the half-split (Llama) layout.

    Frequency i of head_dim/2 is theta^(-2i/head_dim), repeated for both halves. The angles are
    computed in float32 (float64 for float64) and only the final cos/sin are rounded to `dtype`,
    as Hugging Face's Llama does: position·frequency reaches thousands of radians, where a bf16
    angle would be off by whole turns.
    """
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=acc, device=device) / head_dim)
    angles = torch.outer(torch.arange(length, dtype=acc, device=device), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x·cos + rotate_half(x)·sin over the last dim, with rotate_half(x) = (−x₂, x₁)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    """Multi-head self-attention with a fused qkv projection, GQA/MQA and optional rotary embedding.

    forward(x: (B, N, embed_dim)) -> (B, N, embed_dim):
        q, k, v = split(qkv_proj(x))            one Linear: embed_dim -> (H + 2·Hkv)·D
        q, k = RoPE(q), RoPE(k)                 when rope_theta is not None
        o = attention(q, k, v, causal=causal)   k/v heads shared by H/Hkv query heads, never repeated
        return out_proj(o)                      H·D -> embed_dim
    with H = num_heads, Hkv = num_kv_heads (default H), D = embed_dim / H.

    Training: the attention step is ta.attention forward and backward (the tiled backward of our
    kernels), in grad mode as under `torch.no_grad()` / `torch.inference_mode()`.

    Args:
        embed_dim: model width E; a multiple of num_heads with head dim E/num_heads <= 256.
        num_heads: query heads H.
        num_kv_heads: key/value heads (GQA; 1 is MQA); must divide num_heads. Default num_heads.
        causal: query i attends to keys j <= i.
        bias: biases on both projections.
        rope_theta: RoPE base (10000.0 in Llama 1/2); None for no positional rotation. Half-split
            (rotate_half) convention; position 0 is the first token of x.
        backend: the attention backend (None: fastest for the device; see ta.attention).
        device, dtype: for the parameters, as in torch.nn.Linear.
    """

    def __init__(self, embed_dim: int, num_heads: int, num_kv_heads: int | None = None,
                 causal: bool = True, bias: bool = False, rope_theta: float | None = None, *,
                 backend: str | None = None, device=None, dtype=None):
        super().__init__()
        embed_dim = _positive_int("embed_dim", embed_dim)
        num_heads = _positive_int("num_heads", num_heads)
        num_kv_heads = num_heads if num_kv_heads is None else _positive_int("num_kv_heads", num_kv_heads)
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be a multiple of num_heads ({num_heads})")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads "
                             f"({num_kv_heads}) for grouped-query attention")
        head_dim = embed_dim // num_heads
        if head_dim > _checks.MAX_HEAD_DIM:
            raise ValueError(f"head dim embed_dim/num_heads = {embed_dim}/{num_heads} = {head_dim} "
                             f"must be <= {_checks.MAX_HEAD_DIM}")
        if rope_theta is not None:
            if isinstance(rope_theta, bool) or not isinstance(rope_theta, (int, float)):
                raise TypeError(f"rope_theta must be None or a float, got {type(rope_theta).__name__}")
            if not 1.0 < rope_theta < float("inf"):
                raise ValueError(f"rope_theta must be a finite number > 1, got {rope_theta}")
            if head_dim % 2:
                raise ValueError(f"rotary embedding needs an even head dim, got embed_dim/num_heads "
                                 f"= {head_dim}")
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
        if backend is not None and backend not in _checks.BACKENDS:
            raise ValueError(f"backend must be None or one of {_checks.BACKENDS}, got {backend!r}")
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, num_kv_heads
        self.head_dim, self.causal, self.backend = head_dim, causal, backend
        self.rope_theta = None if rope_theta is None else float(rope_theta)
        factory = {"device": device, "dtype": dtype}
        self.qkv_proj = nn.Linear(embed_dim, (num_heads + 2 * num_kv_heads) * head_dim, bias=bias,
                                  **factory)
        self.out_proj = nn.Linear(num_heads * head_dim, embed_dim, bias=bias, **factory)
        # (device, dtype) -> (cos, sin) for the longest sequence seen; shorter ones slice it.
        self._rope_cache: dict = {}

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, causal={self.causal}, "
                f"rope_theta={self.rope_theta}")

    def _rotary(self, n: int, dtype: torch.dtype, device) -> tuple:
        if torch.compiler.is_compiling():
            # In a compiled graph the tables are a few fused element-wise ops; a Python-side cache
            # would only add guards and recompiles.
            return rotary_tables(n, self.head_dim, self.rope_theta, dtype, device)
        key = (torch.device(device), dtype)
        cached = self._rope_cache.get(key)
        if cached is None or cached[0].shape[0] < n:
            cached = rotary_tables(n, self.head_dim, self.rope_theta, dtype, device)
            self._rope_cache[key] = cached
        return cached[0][:n], cached[1][:n]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _checks.check_tensor("x", x, ndim=3, layout_hint="(B, N, embed_dim)")
        if x.shape[-1] != self.embed_dim:
            raise ValueError(f"x must have embed_dim={self.embed_dim} features in its last dim, got "
                             f"shape {tuple(x.shape)}")
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x)
        # Views, not copies: the kernels take any strides.
        q = rearrange(qkv[..., :h * d], "b n (h d) -> b h n d", h=h)
        k = rearrange(qkv[..., h * d:(h + hkv) * d], "b n (h d) -> b h n d", h=hkv)
        v = rearrange(qkv[..., (h + hkv) * d:], "b n (h d) -> b h n d", h=hkv)
        if self.rope_theta is not None:
            cos, sin = self._rotary(x.shape[1], q.dtype, q.device)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        o = self._attend(q, k, v)
        # Our output is (B, N, H, D) in memory, so this rearrange is a view.
        return self.out_proj(rearrange(o, "b h n d -> b n (h d)"))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """(B, H, N, D) q and (B, Hkv, N, D) k, v -> (B, H, N, D). A subclass may swap the
        attention step alone (examples/gpt.py times torch's SDPA this way)."""
        return attention(q, k, v, causal=self.causal, backend=self.backend)
