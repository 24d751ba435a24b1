"""Registration of attn_implementation="tiled_attn" with Hugging Face transformers (placeholder)."""


def register() -> None:
    raise NotImplementedError("transformers registration is being written")
