"""tiled_attn: FlashAttention-style tiled attention and online softmax for PyTorch.

Public API (DESIGN §3): softmax, log_softmax, softmax_kernels, attention, attention_varlen,
attention_kvcache, scaled_dot_product_attention, nn, integrations, distributed (imported on first
use: `import tiled_attn` touches nothing of torch.distributed).
"""
from . import integrations, nn
from .attention import attention, scaled_dot_product_attention
from .kvcache import attention_kvcache
from .softmax import log_softmax, softmax, softmax_kernels
from .varlen import attention_varlen

__all__ = ["softmax", "log_softmax", "softmax_kernels", "attention", "attention_varlen",
           "attention_kvcache", "scaled_dot_product_attention", "nn", "integrations", "distributed"]
__version__ = "0.1.0"


def __getattr__(name):
    # ta.distributed (context parallelism) is imported on first use, not by `import tiled_attn`.
    if name == "distributed":
        import importlib
        return importlib.import_module(".distributed", __name__)
    raise AttributeError(f"module 'tiled_attn' has no attribute {name!r}")
