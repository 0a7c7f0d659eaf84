"""fms-hf-tuning v3.1.0's tokenizer helpers: the special tokens a tokenizer lacks, and adding tokens with the
model's embeddings grown to match (``tokenizer_data_utils``, the older module name, holds the same function)."""

import logging
import math

logger = logging.getLogger(__name__)

DEFAULT_SPECIAL_TOKENS = {"pad_token": "<PAD>", "eos_token": "</s>", "bos_token": "<s>", "unk_token": "<unk>"}
_LLAMA_SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}


def get_special_tokens_dict(tokenizer_name_or_path: str | None, tokenizer) -> dict:
    """The special tokens to add to the model's own tokenizer (none when a tokenizer was named separately): Llama's
    four, a pad token for GPT-2 and GPT-NeoX, a default for each of pad, eos, bos and unk that is missing, and a pad
    token distinct from eos (set on ``tokenizer`` right away, as fms-hf-tuning does)."""
    import transformers

    if tokenizer_name_or_path:
        return {}
    special_tokens = {}
    if isinstance(tokenizer, transformers.LlamaTokenizer | transformers.LlamaTokenizerFast):
        special_tokens.update(_LLAMA_SPECIAL_TOKENS)
    elif isinstance(tokenizer, transformers.GPT2Tokenizer | transformers.GPTNeoXTokenizerFast):
        special_tokens["pad_token"] = "<pad>"
    for name, default in DEFAULT_SPECIAL_TOKENS.items():
        if getattr(tokenizer, name) is None:
            logger.warning("%s missing in the tokenizer: set to %s", name, default)
            special_tokens[name] = default
    if tokenizer.pad_token is not None and tokenizer.pad_token == tokenizer.eos_token:
        logger.warning("the pad token is the eos token: set to a token of its own")
        name = "pad_token" if tokenizer.eos_token != DEFAULT_SPECIAL_TOKENS["pad_token"] else "eos_token"
        setattr(tokenizer, name, DEFAULT_SPECIAL_TOKENS[name])
        special_tokens[name] = DEFAULT_SPECIAL_TOKENS[name]
    return special_tokens


def tokenizer_and_embedding_resize(special_tokens_dict: dict, tokenizer, model, multiple_of: int = 1) -> dict:
    """Add ``special_tokens_dict`` and resize the embeddings to ``len(tokenizer)`` rounded up to ``multiple_of``.

    Every row beyond the model's old size (also for tokens added before this call) starts as the mean of the existing
    rows, input and output: greedy decoding is unchanged. Returns, as fms-hf-tuning v3.1.0 counts them, the tokens
    added here plus the rows added to reach the multiple, and the new embedding size.
    """
    added = tokenizer.add_special_tokens(special_tokens_dict, replace_extra_special_tokens=False)
    old_size = model.get_input_embeddings().weight.shape[0]
    new_size = multiple_of * math.ceil(len(tokenizer) / multiple_of)
    num_new_tokens = added + new_size - len(tokenizer)
    model.resize_token_embeddings(new_size, mean_resizing=False)
    if new_size > old_size:
        embeddings = [model.get_input_embeddings()]
        if model.get_output_embeddings() is not None:
            embeddings.append(model.get_output_embeddings())
        for embedding in embeddings:
            weight = embedding.weight.data
            weight[old_size:] = weight[:old_size].mean(dim=0, keepdim=True)
    return {"num_new_tokens": num_new_tokens, "new_embedding_size": new_size}
