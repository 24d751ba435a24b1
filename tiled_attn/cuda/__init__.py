"""The CUDA backend (placeholder until the extension loader lands)."""
SOFTMAX_KERNELS = ()


def is_available() -> bool:
    return False


def require() -> None:
    raise RuntimeError("the CUDA backend is not built yet")


def require_attention(q) -> None:
    require()
