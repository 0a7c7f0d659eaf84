"""Adding special tokens to a tokenizer and growing the model's embeddings to match (fms-hf-tuning's API)."""

import math


def tokenizer_and_embedding_resize(special_tokens_dict: dict, tokenizer, model, multiple_of: int = 8) -> dict:
    """Add ``special_tokens_dict`` and resize the embeddings to ``len(tokenizer)`` rounded up to ``multiple_of``.

    Every row beyond the model's old size (also for tokens added before this call) starts as the mean of the existing
    rows, input and output: greedy decoding is unchanged. Returns the tokens added here and the new embedding size.
    """
    num_new_tokens = tokenizer.add_special_tokens(special_tokens_dict)
    old_size = model.get_input_embeddings().weight.shape[0]
    new_size = multiple_of * math.ceil(len(tokenizer) / multiple_of)
    model.resize_token_embeddings(new_size, mean_resizing=False)
    if new_size > old_size:
        embeddings = [model.get_input_embeddings()]
        if model.get_output_embeddings() is not None:
            embeddings.append(model.get_output_embeddings())
        for embedding in embeddings:
            weight = embedding.weight.data
            weight[old_size:] = weight[:old_size].mean(dim=0, keepdim=True)
    return {"num_new_tokens": num_new_tokens, "new_embedding_size": new_size}
