"""The tiny model's tokenizer encodes as a small Llama tokenizer does, so tests written against real models hold."""

from transformers import AutoTokenizer

from tuning.data.masking import IGNORE_INDEX, tokenize_and_mask


def test_tokenizer_prepends_bos_as_llama_does(tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    text = "### Input: What is 2 plus 2?\n\n### Response: 4."
    plain = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer(text)["input_ids"] == [tokenizer.bos_token_id, *plain]
    assert tokenizer("a", "b")["input_ids"] == [
        tokenizer.bos_token_id,
        *tokenizer("a", add_special_tokens=False)["input_ids"],
        tokenizer.bos_token_id,
        *tokenizer("b", add_special_tokens=False)["input_ids"],
    ]
    assert tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text
    assert tokenizer.eos_token_id not in tokenizer(text)["input_ids"]  # Llama appends no EOS; the data step does
    (row,) = tokenize_and_mask([text], tokenizer, 64, "\n### Response:")
    assert row["input_ids"][0] == tokenizer.bos_token_id and row["labels"][0] == IGNORE_INDEX
