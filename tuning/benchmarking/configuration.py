"""The dump's ``config``: the arguments that define a run's work, as one flat JSON object (argument name → value).
Two runs are the same configuration exactly when their ``config`` objects are equal, so it holds what changes what is
computed or what it costs on purpose (model, data, batch, sequence length, PEFT method and its shape, precision,
attention, parallelism, steps, the side work inside measured steps: evaluation and checkpoints) and nothing that
only names or places a run (output_dir, run names, trackers, logging, seed: a seed picks other samples of the same
work). ``CONFIG_ARGUMENTS`` lists them; the PEFT method's own arguments appear only for that method, and
``data_config_sha256`` (the data config file's bytes) joins them, since a file edited under the same path is other
work. Torch-free.
"""

import dataclasses
import hashlib
import json
import os
from typing import Any

from tuning.utils.acceleration import run_description

PEFT_METHOD = "peft_method"
WORLD_SIZE = "world_size"
DATA_CONFIG_SHA256 = "data_config_sha256"
# What the run gets, beside what was asked: the attention implementation the model is loaded with, and the sequence
# length once the tokenizer's model_max_length caps --max_seq_length (null when the tokenizer's files cannot be read).
ATTENTION_IMPLEMENTATION = "attn_implementation"
EFFECTIVE_MAX_SEQ_LENGTH = "effective_max_seq_length"
MODEL_CLASS = "model_class"
# Argument names by where ``parse_arguments``' values hold them. "lora" and "pt": only when that is the PEFT method.
CONFIG_ARGUMENTS: dict[str, tuple[str, ...]] = {
    "model_args": (
        "model_name_or_path",
        "tokenizer_name_or_path",
        "torch_dtype",
        "use_flash_attn",
        "flash_attn_implementation",
        "embedding_size_multiple_of",
    ),
    "data_args": (
        "training_data_path",
        "validation_data_path",
        "data_config_path",
        "dataset_text_field",
        "data_formatter_template",
        "response_template",
        "add_special_tokens",
        "chat_template",
        "dataset_conversation_field",
        "dataset_image_field",
        "instruction_template",
        "do_dataprocessing_only",
    ),
    "training_args": (
        "per_device_train_batch_size",
        "per_device_eval_batch_size",
        "gradient_accumulation_steps",
        "max_seq_length",
        "packing",
        "max_steps",
        "num_train_epochs",
        "gradient_checkpointing",
        "gradient_checkpointing_kwargs",
        "bf16",
        "fp16",
        "tf32",
        "optim",
        "torch_compile",
        "use_cpu",
        "fsdp",
        "fsdp_config",
        "eval_strategy",
        "eval_steps",
        "save_strategy",
        "save_steps",
        "dataloader_num_workers",
    ),
    "lora": (
        "r",
        "target_modules",
        "exclude_modules",
        "lora_dropout",
        "bias",
        "use_dora",
        "lora_bias",
        "modules_to_save",
        "layers_to_transform",
        "layers_pattern",
        "trainable_token_indices",
        "target_parameters",
    ),
    "pt": ("num_virtual_tokens",),
    # fms-acceleration's flags as given (v3.1.0's parsed dataclasses, by their fields' values); run_configuration
    # adds what they make the run load (tuning.utils.acceleration.run_description).
    "quantized_lora_config": ("auto_gptq", "bnb_qlora"),
    "fusedops_kernels_config": ("fused_lora", "fast_kernels"),
    "attention_and_distributed_packing_config": ("padding_free", "multipack"),
    "fast_moe_config": ("fast_moe",),
}
# Arguments that change nothing unless another one is set so, null otherwise: runs that differ only in them are the
# same configuration.
_ONLY_WITH = {
    "fsdp_config": lambda config: bool(config["fsdp"]),
    "num_train_epochs": lambda config: config["max_steps"] <= 0,
    "eval_steps": lambda config: config["eval_strategy"] == "steps",
    "per_device_eval_batch_size": lambda config: config["eval_strategy"] != "no",
    "save_steps": lambda config: config["save_strategy"] == "steps",
    "flash_attn_implementation": lambda config: bool(config["use_flash_attn"]),
}


def run_configuration(args: Any, world_size: int) -> dict[str, Any]:
    """``args`` (``parse_arguments``' ``ParsedArguments``) and the number of processes as the dump's ``config``: the
    ``CONFIG_ARGUMENTS`` values as JSON values (a dtype, an enum or an option list as its text), plus ``peft_method``
    (lora, pt or none), ``world_size``, ``data_config_sha256`` (null without a data config) and ``model_class`` (the
    architecture the model's config.json names, as ``model_architecture`` reads it); an argument that
    changes nothing as the others are set (``_ONLY_WITH``: ``eval_steps`` without step-wise evaluation...) is null."""
    from tuning.data.data_config import job_data_config_sha256  # the data framework's imports: only for a job

    tune_config = args.tune_config
    peft_method = {"LoraConfig": "lora", "PromptTuningConfig": "pt"}.get(type(tune_config).__name__, "none")
    if tune_config is not None and peft_method == "none":
        peft_method = type(tune_config).__name__  # a peft library config handed to train() by a caller
    alora = peft_method == "lora" and bool(getattr(tune_config, "alora_invocation_string", None))
    config: dict[str, Any] = {
        PEFT_METHOD: peft_method,
        WORLD_SIZE: world_size,
        DATA_CONFIG_SHA256: job_data_config_sha256(args.data_args),
        MODEL_CLASS: model_architecture(args.model_args.model_name_or_path),
    }
    for where, names in CONFIG_ARGUMENTS.items():
        holder = tune_config if where in ("lora", "pt") else getattr(args, where)
        if where in ("lora", "pt") and where != peft_method:
            continue
        for name in names:
            config[name] = _json_value(getattr(holder, name, None))
    # What the acceleration flags make the run load (grouped_mm experts, expert-parallel degree, quantisation), so
    # that runs of other kernels or layouts never compare as the same configuration.
    config.update(run_description(args.quantized_lora_config, args.fast_moe_config))
    if alora:  # aLoRA: LoRA's shape plus the text that activates it
        config[PEFT_METHOD] = "alora"
        config["alora_invocation_string"] = tune_config.alora_invocation_string
    for name, matters in _ONLY_WITH.items():
        if not matters(config):
            config[name] = None
    config[ATTENTION_IMPLEMENTATION] = attention_implementation(args.model_args)
    config[EFFECTIVE_MAX_SEQ_LENGTH] = effective_max_seq_length(args.model_args, args.training_args.max_seq_length)
    return dict(sorted(config.items()))


def attention_implementation(model_args: Any) -> str:
    """The attention implementation ``train()`` loads the model with: sdpa unless flash attention is asked for and
    can run here (then ``--flash_attn_implementation``)."""
    if not model_args.use_flash_attn:
        return "sdpa"
    from tuning.sft_trainer import _attention_implementation  # needs torch: only when flash attention is asked for

    return _attention_implementation(model_args, quiet=True)


def _local_json(source: str | None, name: str) -> dict[str, Any] | None:
    """The JSON object of the file ``name`` of a model or tokenizer ``source``: from a local directory or the Hugging
    Face cache, never downloaded; None where neither holds it or it cannot be read (the job's own checks name that
    fault)."""
    if not source:
        return None
    path = os.path.join(source, name)
    if not os.path.isfile(path):
        from huggingface_hub import try_to_load_from_cache

        try:
            path = try_to_load_from_cache(source, name)
        except ValueError:  # not a repository id
            return None
        if not isinstance(path, str) or not os.path.isfile(path):
            return None
    try:
        with open(path, encoding="utf-8") as handle:
            content = json.load(handle)
    except (OSError, ValueError):
        return None
    return content if isinstance(content, dict) else None


def effective_max_seq_length(model_args: Any, max_seq_length: int) -> int | None:
    """``max_seq_length`` capped by the tokenizer's ``model_max_length``, as ``train()`` caps it; None when the
    tokenizer's ``tokenizer_config.json`` is neither in a local folder nor in the Hugging Face cache."""
    tokenizer = _local_json(model_args.tokenizer_name_or_path or model_args.model_name_or_path, "tokenizer_config.json")
    if tokenizer is None:
        return None
    limit = tokenizer.get("model_max_length")
    return max_seq_length if not isinstance(limit, int | float) else min(max_seq_length, int(limit))


def model_architecture(model: str | None) -> str | None:
    """The model class a checkpoint's config.json names first in ``architectures`` (``LlavaForConditionalGeneration``,
    ``LlamaForCausalLM``); None where it cannot be read."""
    architectures = (_local_json(model, "config.json") or {}).get("architectures")
    return architectures[0] if isinstance(architectures, list) and architectures else None


def file_sha256(path: str | None) -> str | None:
    """The sha256 of the file's bytes as hex; None without a path or when it cannot be read (the job's own checks
    name that fault)."""
    if not path:
        return None
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(2**20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def _json_value(value: Any) -> Any:
    """``value`` as JSON holds it, one spelling per setting, so that equal settings compare equal: enums by their
    value ("steps", not "IntervalStrategy.STEPS"), a torch.dtype by its name ("bfloat16", as the flag is written), a
    parsed v3.1.0 dataclass (``PaddingFree``) by its fields' values, anything else JSON lacks as its text."""
    if hasattr(value, "value") and isinstance(value.value, str | int):
        value = value.value
    if type(value).__name__ == "dtype" and str(value).startswith("torch."):
        value = str(value).removeprefix("torch.")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [_json_value(getattr(value, spec.name)) for spec in dataclasses.fields(value)]
        value = fields[0] if len(fields) == 1 else fields
    return json.loads(json.dumps(value, default=lambda item: getattr(item, "value", None) or str(item)))
