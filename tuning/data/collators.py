"""Collators of fms-hf-tuning v3.1.0's data framework. ``CompletionOnlyCollator`` stands where v3.1.0 used TRL 0.x's
``DataCollatorForCompletionOnlyLM`` (TRL 1.x removed it): it pads tokenised rows and trains only on the tokens after
each response template, up to the next instruction template. tuning-bench's own pipeline masks while tokenising
(``tuning.data.masking``), so training never needs it; it is here for code that asks ``get_data_collator`` for one.
``VisionDataCollator`` is ``tuning.data.vision``'s, under v3.1.0's name and calling convention."""

import torch

from tuning.data.vision import VisionDataCollator

__all__ = ["CompletionOnlyCollator", "VisionDataCollator"]

IGNORE_INDEX = -100


def _find(sequence: list[int], pattern: list[int], start: int = 0) -> int:
    """The index just after the first occurrence of ``pattern`` in ``sequence`` at or after ``start``; -1 if none."""
    width = len(pattern)
    for index in range(start, len(sequence) - width + 1):
        if sequence[index : index + width] == pattern:
            return index + width
    return -1


class CompletionOnlyCollator:
    """Pad ``input_ids`` (and ``labels``); label -100 everything outside the responses (by template token ids)."""

    def __init__(
        self, tokenizer, response_template: str | list[int], instruction_template: str | list[int] | None = None
    ):
        def ids(template):
            return tokenizer.encode(template, add_special_tokens=False) if isinstance(template, str) else list(template)

        self.tokenizer = tokenizer
        self.response_ids = ids(response_template)
        self.instruction_ids = ids(instruction_template) if instruction_template is not None else None

    def _labels(self, input_ids: list[int]) -> list[int]:
        labels = [IGNORE_INDEX] * len(input_ids)
        position = 0
        while (start := _find(input_ids, self.response_ids, position)) >= 0:
            end = len(input_ids)
            if self.instruction_ids:
                following = _find(input_ids, self.instruction_ids, start)
                end = following - len(self.instruction_ids) if following >= 0 else end
            labels[start:end] = input_ids[start:end]
            position = end
            if not self.instruction_ids:
                break
        return labels

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        rows = [list(feature["input_ids"]) for feature in features]
        width = max(len(row) for row in rows)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for index, row in enumerate(rows):
            input_ids[index, : len(row)] = torch.tensor(row)
            labels[index, : len(row)] = torch.tensor(self._labels(row))
            attention_mask[index, : len(row)] = 1
        return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}
