"""The 2.x module name of ``tuning.data.tokenizer_utils.tokenizer_and_embedding_resize``."""

from tuning.data.tokenizer_utils import tokenizer_and_embedding_resize

__all__ = ["tokenizer_and_embedding_resize"]
