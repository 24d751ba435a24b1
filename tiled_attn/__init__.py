"""tiled_attn: FlashAttention-style tiled attention and online softmax for PyTorch.

Public API (DESIGN §3): softmax, log_softmax, softmax_kernels, attention, attention_varlen,
attention_kvcache, scaled_dot_product_attention, nn, integrations, distributed.
"""
# distributed: ~5 ms, initializes nothing (torch has imported torch.distributed already). Imported
# here, not on first use through a module __getattr__: torch.compile's Dynamo does not call one, so
# `ta.distributed` inside a compiled function would raise AttributeError.
from . import distributed, integrations, nn
from .attention import attention, scaled_dot_product_attention
from .kvcache import attention_kvcache
from .softmax import log_softmax, softmax, softmax_kernels
from .varlen import attention_varlen

__all__ = ["softmax", "log_softmax", "softmax_kernels", "attention", "attention_varlen",
           "attention_kvcache", "scaled_dot_product_attention", "nn", "integrations", "distributed"]
__version__ = "0.1.0"
