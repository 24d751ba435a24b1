"""Integrations with other libraries; each imports its library only when used."""
from . import transformers  # noqa: F401  (imports transformers lazily, inside register())
