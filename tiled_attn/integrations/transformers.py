"""attn_implementation="tiled_attn" for Hugging Face transformers models.

    import tiled_attn as ta
    ta.integrations.transformers.register()
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="tiled_attn")

`register()` adds `attention_forward` to transformers' AttentionInterface, and (transformers ≥ 4.53)
registers transformers' own SDPA mask builder for the same name, so the model hands us exactly the
mask it would hand "sdpa": None when the mask is plain causal or absent (then our kernels run), a
4-D boolean mask when there is padding or another pattern (then the call goes to torch's SDPA with
that mask, through ta.scaled_dot_product_attention: the same result "sdpa" gives, never a silently
different one). Without a registered mask builder, transformers ≥ 4.53 would pass no mask at all to
an unknown implementation and padding would be ignored. Older transformers build a full 4-D mask for
any implementation other than its own, which is correct and always runs torch's SDPA.

transformers is imported only inside register(): importing tiled_attn never needs it.
"""
from __future__ import annotations

import torch

from ..attention import scaled_dot_product_attention

__all__ = ["register", "attention_forward", "NAME"]

NAME = "tiled_attn"


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query (B, H, Nq, D), key/value (B, Hkv, Nk, D)
    with H % Hkv == 0; returns (output (B, Nq, H, D), None).

    The causal flag follows transformers' sdpa integration exactly: `is_causal` from kwargs, else
    `module.is_causal`, and only for Nq > 1 with no mask (then Nq == Nk or the keys past Nq are the
    empty tail of a static cache, which is dropped, so top-left and bottom-right alignment agree).
    What only transformers' own SDPA path knows how to do (a position-bias mask, a paged cache,
    softcapping) is handed to it unchanged: the same kernels "sdpa" runs. A call that needs a
    gradient (training) runs our forward and backward kernels.
    """
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("tiled_attn has no attention sinks (s_aux): use "
                                  "attn_implementation='eager' for this model")
    if any(kwargs.get(k) is not None for k in ("position_bias", "cache", "softcap")):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    q_len = query.shape[2]
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(q_len > 1 and attention_mask is None and is_causal)
    if is_causal and key.shape[2] > q_len:
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    if attention_mask is not None:
        attention_mask = attention_mask[:, :, :, :key.shape[2]]
        if key.shape[1] != query.shape[1]:
            # The call goes to torch's SDPA; its fused kernels take a mask but not GQA, so give it
            # repeated k/v heads as transformers' sdpa path does.
            rep = query.shape[1] // key.shape[1]
            key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    out = scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                       is_causal=is_causal, scale=scaling,
                                       enable_gqa=key.shape[1] != query.shape[1])
    # Our kernels' output is (B, Nq, H, D) in memory already, so this is a free view there.
    return out.transpose(1, 2).contiguous(), None


def register(name: str = NAME) -> None:
    """Make `attn_implementation=name` ("tiled_attn") available to transformers models."""
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
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:
        return  # transformers < 4.53: the model builds a full 4-D mask for us (see the module doc)
    AttentionMaskInterface.register(name, sdpa_mask)
