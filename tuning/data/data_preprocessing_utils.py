"""``get_data_collator``: the collator fms-hf-tuning v3.1.0 picks for a run's data."""

from transformers import DataCollatorForSeq2Seq

from tuning.data.collators import CompletionOnlyCollator, VisionDataCollator
from tuning.utils.error_logging import UserInputError


def get_data_collator(
    packing: bool,
    response_template: str | None,
    tokenizer,
    is_traindata_tokenized: bool,
    max_seq_length: int,
    instruction_template: str | None,
    is_padding_free: bool = False,
    processor=None,
):
    """None with packing (TRL's own collator); padding for tokenised or padding-free data; else a collator that
    trains on the responses (``CompletionOnlyCollator``, in place of TRL 0.x's ``DataCollatorForCompletionOnlyLM``)."""
    if processor:
        if is_padding_free or packing:
            raise UserInputError("Vision model tuning does not support packing or padding_free tuning.")
        return VisionDataCollator(processor)
    if packing:
        return None
    if is_padding_free:
        return DataCollatorForSeq2Seq(tokenizer=tokenizer, padding=False, max_length=max_seq_length)
    if is_traindata_tokenized:
        return DataCollatorForSeq2Seq(tokenizer=tokenizer, padding=True, max_length=max_seq_length)
    if response_template:
        return CompletionOnlyCollator(tokenizer, response_template, instruction_template)
    raise UserInputError("Could not pick a data collator: give --response_template, --packing or tokenised data")
