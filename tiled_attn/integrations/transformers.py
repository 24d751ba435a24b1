"""attn_implementation="tiled_attn" for Hugging Face transformers models.

    import tiled_attn as ta
    ta.integrations.transformers.register()
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="tiled_attn")

`register()` adds `attention_forward` to transformers' AttentionInterface and, on transformers ≥ 4.53
(masking_utils.AttentionMaskInterface), our own mask builder `tiled_attn_mask` for the same name.
(Without a registered mask builder transformers ≥ 4.53 would hand an unknown implementation no
mask at all, and padding would be ignored.)

The mask builder (called once per forward and mask kind by create_causal_mask /
create_sliding_window_causal_mask, never per layer) recognizes the two patterns our kernels
express — transformers' causal mask function, and its sliding-window causal mask (the and of
`sliding_window_overlay(w)` and the causal function: key j is visible from query i iff
0 <= i - j < w, i.e. our window (w - 1, 0)) — and returns what attention_forward needs:

* None: no padding and nothing to cut or window (Nq == Nk, or one query seeing every key; or a
  static cache's prefill, whose keys past Nq are empty) — exactly where "sdpa" gets None too.
* else a 2-D boolean (B, L) key mask (True = attend), L = q_offset + Nq − kv_offset the number of
  cached keys at or before the last query (keys past L — a static cache's empty tail — are
  invisible to every query and dropped), so queries are bottom-right aligned over the first L keys
  (causal_offset = L − Nq: query i sits at absolute position q_offset + i). The mask carries a tag
  (attribute `_tiled_attn_mask` = (window left, every key valid)) with the window of the pattern
  it was built for: the window comes from the mask, as it does for "sdpa" and "eager", not from
  the `sliding_window` keyword some models leave out (Qwen2-MoE). (An untagged 2-D mask — one
  that lost the tag, e.g. moved between devices — is read with flash-attention's convention:
  padding only, the window (sliding_window − 1, 0) from the keyword.)

Anything else (or/and mask overlays, packed sequences, block-wise vision masks, chunked attention,
bidirectional masks, allow_is_causal_skip=False — a model that edits the mask, or a static cache's
decode step — and any call under torch.compile/tracing, where reading the padding would be a
data-dependent branch) gets transformers' own sdpa_mask result unchanged: a 4-D mask or None.

attention_forward routes each call:

1. a 2-D key mask (ours, above): keys cut to L; every key valid → ta.attention(causal=True,
   window=(left, 0), softcap=); else masked_attention(q, k, v, key_mask, causal=True,
   causal_offset=L − Nq, window=, softcap=). Our kernels, forward and backward (training).
2. None: ta.scaled_dot_product_attention with transformers' sdpa flags (is_causal for Nq > 1, the
   empty tail of a static cache dropped), or ta.attention(causal=True, softcap=) with a softcap.
3. a 4-D mask (transformers < 4.53 builds one for every call, ≥ 4.53 in the fallbacks above),
   no softcap: ta.scaled_dot_product_attention with it, which runs our kernels where the mask only pads keys
   (the same row for every query: a static cache's decode step, one query) and torch's SDPA
   otherwise — "sdpa"'s result either way.
4. what neither expresses — dropout_p > 0, a 4-D mask with a softcap, a position bias, a paged
   (continuous batching) cache, head dims or dtypes our kernels lack: transformers' own SDPA
   integration, unchanged, or, with a softcap (which torch's SDPA lacks; transformers' sdpa path
   raises), the eager softmax(softcap(scale·q kᵀ) + mask) v that transformers' eager path
   computes.

transformers is imported only inside register(): importing tiled_attn never needs it.
"""
from __future__ import annotations

import torch

from .. import _checks
from ..attention import attention, masked_attention, scaled_dot_product_attention

__all__ = ["register", "attention_forward", "tiled_attn_mask", "NAME"]

NAME = "tiled_attn"
# The attribute our mask builder sets on each 2-D mask it returns: (window left or -1, all valid).
TAG = "_tiled_attn_mask"

# transformers.masking_utils pieces, looked up by register() (transformers ≥ 4.53).
_SDPA_MASK = None          # its sdpa mask builder: the fallback
_CAUSAL = None             # causal_mask_function
_AND_CODE = None           # the code of and_masks' closure
_OVERLAY_CODE = None       # the code of sliding_window_overlay's closure
_WINDOWS: dict = {}        # (overlay code, sliding_window) -> our window's left edge


# ------------------------------------------------------------------------------------------------
# the mask builder
# ------------------------------------------------------------------------------------------------
def _closure(fn) -> dict:
    cells = fn.__closure__ or ()
    return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in cells)))


def _overlay_left(overlay) -> int | None:
    """The left edge of the window a sliding_window_overlay closure keeps, probed once per window
    size (so a transformers version whose overlay uses <= instead of < is read right): query q sees
    keys q − left .. q. None when the overlay is not such a window."""
    try:
        size = _closure(overlay)["sliding_window"]
    except (KeyError, ValueError):
        return None
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        return None
    key = (overlay.__code__, size)
    if key not in _WINDOWS:
        q = size + 2
        z = torch.zeros((), dtype=torch.long)
        try:
            vis = overlay(z, z, torch.tensor(q), torch.arange(q + 1))
            vis = torch.as_tensor(vis, dtype=torch.bool).expand(q + 1).tolist()
        except Exception:  # noqa: BLE001 - an overlay we do not understand: the fallback
            vis = None
        left = None
        if vis is not None and True in vis:
            first = vis.index(True)
            if all(vis[first:]) and first >= 1:
                left = q - first
        _WINDOWS[key] = left
    return _WINDOWS[key]


def _window_of(mask_function) -> int | None:
    """-1 for transformers' causal mask function, the left edge (>= 0) of the window for its
    sliding-window causal one, None for any other pattern."""
    if mask_function is _CAUSAL:
        return -1
    if _AND_CODE is None or getattr(mask_function, "__code__", None) is not _AND_CODE:
        return None
    try:
        parts = tuple(_closure(mask_function)["mask_functions"])
    except (KeyError, TypeError, ValueError):
        return None
    if len(parts) != 2 or sum(p is _CAUSAL for p in parts) != 1:
        return None
    overlay = parts[0] if parts[1] is _CAUSAL else parts[1]
    if getattr(overlay, "__code__", None) is not _OVERLAY_CODE:
        return None
    return _overlay_left(overlay)


def _tracing(*tensors) -> bool:
    if torch.jit.is_tracing() or torch.compiler.is_compiling():
        return True
    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except ImportError:  # pragma: no cover
        return False
    return any(isinstance(t, (FakeTensor, torch.fx.Proxy)) for t in tensors)


def _as_int(x) -> int:
    return int(x.item()) if isinstance(x, torch.Tensor) else int(x)


def tiled_attn_mask(*args, **kwargs):
    """transformers' mask-interface signature (what sdpa_mask takes, by keyword): None, a tagged
    2-D boolean key mask, or — for a pattern our kernels do not express — sdpa_mask's result.
    The module docstring says which."""
    def fallback():
        return _SDPA_MASK(*args, **kwargs)

    if args or not kwargs.get("allow_is_causal_skip", True) or "kv_length" not in kwargs:
        return fallback()
    left = _window_of(kwargs.get("mask_function", _CAUSAL))
    if left is None:
        return fallback()
    attention_mask = kwargs.get("attention_mask")
    if attention_mask is not None and (not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2):
        return fallback()
    if "q_length" in kwargs:  # transformers ≥ 4.56-ish: lengths and offsets
        q_length, q_offset = kwargs["q_length"], kwargs.get("q_offset", 0)
    elif kwargs.get("cache_position") is not None:  # 4.53 ..: the queries' absolute positions
        pos = kwargs["cache_position"]
        q_length, q_offset = pos.shape[0], pos[0] if pos.shape[0] else 0
    else:
        return fallback()
    kv_length, kv_offset = kwargs["kv_length"], kwargs.get("kv_offset", 0)
    if _tracing(attention_mask, q_offset, kv_offset, kwargs.get("cache_position")):
        return fallback()
    q_offset, kv_offset, kv_length, q_length = (_as_int(x) for x in (q_offset, kv_offset, kv_length, q_length))
    if "q_length" not in kwargs and q_length:
        last = _as_int(kwargs["cache_position"][-1])
        if last != q_offset + q_length - 1:  # not consecutive positions
            return fallback()
    n = q_offset + q_length - kv_offset  # keys at or before the last query
    if q_length == 0 or not q_length <= n <= kv_length:
        return fallback()
    if left >= 0 and n <= left + 1:
        left = -1  # the window hides no key from any query
    batch, device = kwargs["batch_size"], kwargs.get("device")
    if device is None:  # transformers 4.53 ..: the device of the queries' positions
        device = kwargs["cache_position"].device if kwargs.get("cache_position") is not None else "cpu"
    key_mask = None
    if attention_mask is not None:
        attention_mask = attention_mask.to(device=device, dtype=torch.bool)
        if attention_mask.shape[1] < kv_offset + n:  # padded with False, as transformers does
            attention_mask = torch.nn.functional.pad(attention_mask, (0, kv_offset + n - attention_mask.shape[1]))
        key_mask = attention_mask[:, kv_offset:kv_offset + n]  # a fresh tensor object: the tag is ours alone
    all_valid = key_mask is None or bool(key_mask.all())
    if all_valid and left < 0 and (n == q_length if q_length > 1 else n == kv_length):
        return None
    if key_mask is None:
        key_mask = torch.ones(batch, n, dtype=torch.bool, device=device)
    setattr(key_mask, TAG, (left, all_valid))
    return key_mask


# ------------------------------------------------------------------------------------------------
# the attention function
# ------------------------------------------------------------------------------------------------
def _ours(query, key, value) -> bool:
    """Whether our kernels take these tensors (else the call goes to transformers' paths)."""
    return (query.dtype in _checks.KERNEL_DTYPES + (torch.float64,) and key.dtype == value.dtype == query.dtype
            and key.shape == value.shape and 0 < query.shape[-1] == key.shape[-1] <= _checks.MAX_HEAD_DIM
            and query.shape[1] % key.shape[1] == 0)


def _eager(module, query, key, value, attention_mask, dropout, scaling, softcap, is_causal):
    """transformers' eager attention (Gemma 2's formula) for what neither our kernels nor torch's
    SDPA express: softmax(softcap(scale·q kᵀ) + mask) v, the softmax in float32. A boolean mask
    is applied as eager's additive one (the dtype's minimum where False). With no mask, the causal
    flag has "sdpa"'s meaning (top-left, for Nq > 1)."""
    rep = query.shape[1] // key.shape[1]
    if rep > 1:
        key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    s = torch.matmul(query, key.transpose(2, 3)) * scale
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    nq, nk = s.shape[-2:]
    if attention_mask is None and is_causal and nq > 1:
        attention_mask = torch.ones(nq, nk, dtype=torch.bool, device=s.device).tril()
    if attention_mask is not None:
        attention_mask = attention_mask[..., :nk]
        if attention_mask.dtype == torch.bool:
            s = s.masked_fill(~attention_mask, torch.finfo(s.dtype).min)
        else:
            s = s + attention_mask
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(query.dtype)
    if dropout:
        p = torch.nn.functional.dropout(p, p=dropout, training=True)
    return torch.matmul(p, value).transpose(1, 2).contiguous(), None


def _dense(key_mask, nq: int, left: int) -> torch.Tensor:
    """The (B, 1, Nq, L) boolean mask a 2-D key mask stands for (bottom-right causal, window)."""
    n = key_mask.shape[1]
    i = torch.arange(nq, device=key_mask.device)[:, None] + (n - nq)
    j = torch.arange(n, device=key_mask.device)[None, :]
    visible = j <= i
    if left >= 0:
        visible = visible & (j >= i - left)
    return key_mask[:, None, None, :] & visible


def _sdpa_path(module, query, key, value, attention_mask, dropout, scaling, is_causal, softcap, kwargs):
    """Transformers' own SDPA integration, unchanged; with a softcap (torch's SDPA has none) the
    eager formula."""
    if softcap is not None:
        if kwargs.get("position_bias") is not None or kwargs.get("cache") is not None:
            raise NotImplementedError("tiled_attn: softcap with a position bias or a paged cache is not "
                                      "supported: use attn_implementation='eager'")
        is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        if attention_mask is None and is_causal and key.shape[2] > query.shape[2] > 1:
            key, value = key[:, :, :query.shape[2]], value[:, :, :query.shape[2]]
        return _eager(module, query, key, value, attention_mask, dropout, scaling, softcap,
                      attention_mask is None and is_causal)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                  scaling=scaling, is_causal=is_causal, **kwargs)


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query (B, H, Nq, D), key/value (B, Hkv, Nk, D)
    with H % Hkv == 0; returns (output (B, Nq, H, D), None). The routing is the module
    docstring's: a 2-D key mask (our mask builder's) and None run our kernels with the mask's
    window and the `softcap` keyword; a 4-D mask, dropout, a position bias or a paged cache go to
    transformers' SDPA path (or, with a softcap, its eager formula). A call that needs a gradient
    (training) runs our forward and backward kernels.
    """
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("tiled_attn has no attention sinks (s_aux): use "
                                  "attn_implementation='eager' for this model")
    softcap = kwargs.get("softcap")
    nq = query.shape[2]
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
        # A key mask (B, L), ours (tiled_attn_mask) or, untagged, flash-attention's convention
        # (the window from the sliding_window keyword); queries bottom-right over its L keys.
        tag = getattr(attention_mask, TAG, None)
        if tag is not None:
            left, all_valid = tag
        else:
            window = kwargs.get("sliding_window")
            left, all_valid = (window - 1 if window else -1), False
            if attention_mask.shape[1] > key.shape[2]:
                attention_mask = attention_mask[:, -key.shape[2]:]
            attention_mask = attention_mask.to(torch.bool)
        n = attention_mask.shape[1]
        key, value = key[:, :, :n], value[:, :, :n]
        if (dropout or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None
                or not _ours(query, key, value)):
            return _sdpa_path(module, query, key, value, _dense(attention_mask, nq, left), dropout, scaling,
                              False, softcap, kwargs)
        window = (left, 0) if left >= 0 else None
        if all_valid:
            out = attention(query, key, value, causal=True, scale=scaling, window=window, softcap=softcap)
        else:
            out = masked_attention(query, key, value, attention_mask, causal=True, causal_offset=n - nq,
                                   scale=scaling, softcap=softcap, window=window)
        return out.transpose(1, 2).contiguous(), None
    if (kwargs.get("position_bias") is not None or kwargs.get("cache") is not None
            or not _ours(query, key, value)
            or (attention_mask is not None and not isinstance(attention_mask, torch.Tensor))):
        return _sdpa_path(module, query, key, value, attention_mask, dropout, scaling, is_causal, softcap, kwargs)
    if attention_mask is not None or dropout:
        if attention_mask is not None and softcap is None and attention_mask.dim() == 4:
            attention_mask = attention_mask[:, :, :, :key.shape[2]]
            # A mask the same for every query (one query: a static cache's decode step) only masks
            # keys: ta.scaled_dot_product_attention runs it on our kernels, GQA included. Any other
            # goes to torch's SDPA, whose fused kernels take a mask but not GQA: give it repeated
            # k/v heads, as transformers' sdpa path does.
            gqa = key.shape[1] != query.shape[1]
            if gqa and not (dropout == 0 and attention_mask.shape[1] == 1
                            and (attention_mask.shape[2] == 1 or attention_mask.stride(2) == 0)):
                rep = query.shape[1] // key.shape[1]
                key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
                gqa = False
            out = scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                               scale=scaling, enable_gqa=gqa)
            return out.transpose(1, 2).contiguous(), None
        return _sdpa_path(module, query, key, value, attention_mask, dropout, scaling, is_causal, softcap, kwargs)
    # No mask: transformers' sdpa flags exactly — causal only for Nq > 1 (then Nq == Nk, or the keys
    # past Nq are the empty tail of a static cache, dropped, so top-left and bottom-right agree).
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(nq > 1 and is_causal)
    if is_causal and key.shape[2] > nq:
        key, value = key[:, :, :nq], value[:, :, :nq]
    if softcap is not None:
        out = attention(query, key, value, causal=is_causal, scale=scaling, softcap=softcap)
    else:
        out = scaled_dot_product_attention(query, key, value, is_causal=is_causal, scale=scaling,
                                           enable_gqa=key.shape[1] != query.shape[1])
    # Our kernels' output is (B, Nq, H, D) in memory already, so this is a free view there.
    return out.transpose(1, 2).contiguous(), None


def register(name: str = NAME) -> None:
    """Make `attn_implementation=name` ("tiled_attn") available to transformers models."""
    global _SDPA_MASK, _CAUSAL, _AND_CODE, _OVERLAY_CODE
    try:
        from transformers import AttentionInterface
    except ImportError:
        try:
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        except ImportError as e:
            raise ImportError("tiled_attn.integrations.transformers.register() needs transformers "
                              ">= 4.48: pip install 'tiled_attn[transformers]'") from e
        ALL_ATTENTION_FUNCTIONS[name] = attention_forward
    else:
        AttentionInterface.register(name, attention_forward)
    try:
        from transformers import masking_utils
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:
        return  # transformers < 4.53: the model builds a full 4-D mask for us (see the module doc)
    _SDPA_MASK = AttentionMaskInterface._global_mapping["sdpa"]
    _CAUSAL = masking_utils.causal_mask_function
    try:
        _AND_CODE = masking_utils.and_masks(_CAUSAL).__code__
        _OVERLAY_CODE = masking_utils.sliding_window_overlay(1).__code__
    except (AttributeError, TypeError):  # no sliding-window overlay here: only the causal pattern is ours
        _AND_CODE = _OVERLAY_CODE = None
    AttentionMaskInterface.register(name, tiled_attn_mask)
