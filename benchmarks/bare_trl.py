"""The baseline arm of ``benchmarks/overhead.py``: the training ``tuning/sft_trainer.py`` does, on bare TRL.

No callbacks, no trackers and no ``tuning.train()``: TRL's ``SFTTrainer`` on a dataset built by the same
``tuning.data`` functions, so every step does the same work as ours and only what we add differs. Flags are
``SFTConfig``'s (TRL's own defaults apply, so pass bf16, gradient checkpointing, learning rate and logging explicitly)
plus the data and model flags below. With CUDA it writes torch's peak memory per device (as in bench_train's dump
summary) to ``CUDA_PEAK_FILE`` in the output directory.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser
from trl import SFTConfig, SFTTrainer

from tuning.data.formatting import format_texts
from tuning.data.loading import load_records
from tuning.data.masking import tokenize_and_mask

CUDA_PEAK_FILE = "cuda_peak_memory.json"


@dataclass
class BareArguments:
    model_name_or_path: str = field(metadata={"help": "Local model directory (tokenizer included)."})
    training_data_path: str = field(metadata={"help": "JSON lines or JSON array training data."})
    response_template: str = field(metadata={"help": "Only what follows it is trained on."})
    torch_dtype: str = field(default="float32", metadata={"help": "bfloat16, float16 or float32."})
    attn_implementation: str = field(default="sdpa", metadata={"help": "sdpa or flash_attention_2."})


def main() -> None:
    bare, config = HfArgumentParser((BareArguments, SFTConfig)).parse_args_into_dataclasses()
    tokenizer = AutoTokenizer.from_pretrained(bare.model_name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    texts = format_texts(
        load_records(bare.training_data_path), tokenizer.eos_token, dataset_text_field=config.dataset_text_field
    )
    dataset = tokenize_and_mask(texts, tokenizer, config.max_length, bare.response_template)
    model = AutoModelForCausalLM.from_pretrained(
        bare.model_name_or_path, dtype=getattr(torch, bare.torch_dtype), attn_implementation=bare.attn_implementation
    )
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    trainer.save_model(config.output_dir)
    if torch.cuda.is_available():  # imported only here: the baseline's start-up stays bare
        from tuning.benchmarking.system_metrics import cuda_peak_memory

        Path(config.output_dir, CUDA_PEAK_FILE).write_text(json.dumps(cuda_peak_memory()))


if __name__ == "__main__":
    main()
