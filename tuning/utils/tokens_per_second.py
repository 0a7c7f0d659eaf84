"""``train_tokens_per_second`` as transformers 4 reported it under ``--include_tokens_per_second`` (transformers 5
dropped the flag; tools written for 4, such as IBM ado's metrics reader, still read the figure)."""

from transformers import TrainerCallback


def count_train_tokens(train_dataloader, args) -> int:
    """transformers 4's count: with ``max_steps``, the first batch's ``input_ids`` size times ``max_steps`` times
    the accumulation steps; otherwise every batch's size, summed over the dataloader, times the epochs."""
    if args.max_steps > 0:
        first_batch = next(iter(train_dataloader))
        return first_batch["input_ids"].numel() * args.max_steps * args.gradient_accumulation_steps
    return int(sum(batch["input_ids"].numel() for batch in train_dataloader) * args.num_train_epochs)


class TokensPerSecondCallback(TrainerCallback):
    """Counts the tokens when training begins (a pass over the train dataloader, as transformers 4 made) and adds
    ``train_tokens_per_second`` (tokens / ``train_runtime``, 4 decimals) to the trainer's final log: callbacks
    placed after this one, the metrics that ``trainer.train()`` returns and ``state.log_history`` carry it."""

    def __init__(self) -> None:
        self.train_tokens: int | None = None

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        if train_dataloader is not None:
            self.train_tokens = count_train_tokens(train_dataloader, args)

    def on_log(self, args, state, control, logs=None, **kwargs):
        runtime = (logs or {}).get("train_runtime")
        if self.train_tokens is not None and runtime:
            logs["train_tokens_per_second"] = round(self.train_tokens / runtime, 4)
            if state.log_history and state.log_history[-1].get("train_runtime") == runtime:  # a copy of logs
                state.log_history[-1]["train_tokens_per_second"] = logs["train_tokens_per_second"]
