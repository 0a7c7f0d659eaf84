"""fms-acceleration's jobs on transformers 5 and peft alone: ``--fast_moe`` (grouped-GEMM experts, expert
parallelism), ``--bnb_qlora`` (bitsandbytes 4-bit base, LoRA on top), ``--auto_gptq`` (a GPTQ checkpoint through
transformers' own GPTQ integration) and ``--fused_lora``/``--fast_kernels`` (transformers' kernels integration).
``load_settings`` checks a job's acceleration flags against its model and peft config before the model loads and
returns ``from_pretrained``'s extra keywords. What a feature needs that this machine lacks is
``tuning.config.acceleration_configs.needs``' (the refusal rule's ``missing``). Torch and transformers are imported
only inside the functions that load."""

import os
from dataclasses import dataclass, field
from typing import Any

from tuning.utils.error_logging import UserInputError

# What --fast_moe loads the experts with: transformers' fastest native implementation (one batched GEMM per projection).
FAST_EXPERTS_IMPLEMENTATION = "grouped_mm"


@dataclass
class LoadSettings:
    """How the model loads for a job's acceleration flags: ``from_pretrained``'s extra keywords, and what they
    amount to (for the dump's ``config``)."""

    keywords: dict[str, Any] = field(default_factory=dict)
    experts_implementation: str | None = None
    ep_degree: int = 1
    quantization: str | None = None
    prepare_for_kbit_training: bool = False  # --bnb_qlora QUANT True: the base model readied for LoRA as v3.1.0's TRL

    @property
    def sharded(self) -> bool:
        """The model is sharded over the ranks as it loads (expert parallelism)."""
        return "distributed_config" in self.keywords


def expert_counts(model_config: Any) -> tuple[int, int] | None:
    """(experts per layer, experts each token is routed to) of a mixture-of-experts config; None for a dense one."""
    config = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    routed = getattr(config, "num_experts_per_tok", None)
    return (int(experts), int(routed or experts)) if experts else None


def name_expert_count(model: Any) -> None:
    """Give a mixture-of-experts config that names its expert count ``num_local_experts`` (Granite MoE, Mixtral) the
    ``num_experts`` that TRL 1.x's load-balancing loss reads on transformers 5 (else an AttributeError mid-step)."""
    config = model.config.get_text_config()
    counts = expert_counts(config)
    if counts is not None and "num_experts" not in config.to_dict():
        config.num_experts = counts[0]


def local_experts(model: Any) -> int | None:
    """How many experts of each layer this rank holds: the leading size of its shard of the first experts weight
    (a DTensor when sharded at load time); None for a model without experts."""
    for name, parameter in model.named_parameters():
        if ".experts." in name and parameter.dim() == 3:
            local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
            return int(local.shape[0])
    return None


def loaded_experts_implementation(model: Any) -> str | None:
    """The experts implementation the loaded ``model`` runs (transformers 5 loads a mixture-of-experts model with
    ``grouped_mm`` unless told otherwise); None for a model without experts."""
    config = model.config.get_text_config()
    if expert_counts(config) is None:
        return None
    return getattr(config, "_experts_implementation", None) or getattr(model.config, "_experts_implementation", None)


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def load_settings(
    model_name_or_path: str,
    cache_dir: str | None,
    peft_config: Any,
    torch_dtype: Any,
    quantized_lora_config: Any = None,
    fusedops_kernels_config: Any = None,
    fast_moe_config: Any = None,
) -> LoadSettings:
    """Check the acceleration flags against the model (its config only: no weights are read) and the PEFT method,
    raising ``UserInputError`` for a combination that cannot train; return how the model loads."""
    settings = LoadSettings(quantization=run_description(quantized_lora_config, fast_moe_config)["quantization"])
    fast_moe = getattr(fast_moe_config, "fast_moe", None)
    if fast_moe is not None:
        _fast_moe_settings(settings, fast_moe, model_name_or_path, cache_dir)
    bnb = getattr(quantized_lora_config, "bnb_qlora", None)
    gptq = getattr(quantized_lora_config, "auto_gptq", None)
    if bnb is not None or gptq is not None:
        flag = "--bnb_qlora" if bnb is not None else "--auto_gptq"
        if bnb is not None and gptq is not None:
            raise UserInputError("--bnb_qlora and --auto_gptq: a base model is quantised one way; give one of them")
        if not _is_lora(peft_config):
            raise UserInputError(
                f"{flag}: quantised LoRA trains LoRA adapters on the frozen quantised model; add --peft_method lora"
            )
    if bnb is not None:
        from transformers import BitsAndBytesConfig

        settings.keywords["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=bnb.quant_type,
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch_dtype,
        )
        settings.prepare_for_kbit_training = bnb.no_peft_model
    if gptq is not None:  # the checkpoint's own quantization_config says GPTQ, and transformers loads it so
        _check_gptq_checkpoint(model_name_or_path, cache_dir)
    fused = getattr(fusedops_kernels_config, "fused_lora", None)
    fast = getattr(fusedops_kernels_config, "fast_kernels", None)
    base_layer = getattr(fused, "base_layer", None)
    if base_layer is not None and {"auto_gptq": gptq, "bitsandbytes": bnb}[base_layer] is None:
        raise UserInputError(  # v3.1.0's words
            f"--fused_lora {base_layer} True: `--fused_lora` must be accompanied by a quantized base layer "
            "`--auto_gptq` or `--bitsandbytes`: the one it names"
        )
    if (fused is not None and fused.fused_lora) or (fast is not None and any(vars(fast).values())):
        settings.keywords["use_kernels"] = True
    return settings


def run_description(quantized_lora_config: Any, fast_moe_config: Any) -> dict[str, Any]:
    """What the acceleration flags make a run load, for the dump's ``config`` (torch-free): ``experts_implementation``
    (grouped_mm with ``--fast_moe``, null: the model's default), ``ep_degree`` (null without ``--fast_moe``) and
    ``quantization`` (``bitsandbytes-nf4``, ``bitsandbytes-fp4``, ``gptq`` or null)."""
    fast_moe = getattr(fast_moe_config, "fast_moe", None)
    bnb = getattr(quantized_lora_config, "bnb_qlora", None)
    gptq = getattr(quantized_lora_config, "auto_gptq", None)
    quantization = f"bitsandbytes-{bnb.quant_type}" if bnb is not None else "gptq" if gptq is not None else None
    return {
        "experts_implementation": FAST_EXPERTS_IMPLEMENTATION if fast_moe is not None else None,
        "ep_degree": fast_moe.ep_degree if fast_moe is not None else None,
        "quantization": quantization,
    }


def _check_gptq_checkpoint(model_name_or_path: str, cache_dir: str | None) -> None:
    """``--auto_gptq`` trains LoRA on a checkpoint quantised by GPTQ already (v3.1.0's ``from_quantized``)."""
    from transformers import AutoConfig

    quantization = getattr(
        AutoConfig.from_pretrained(model_name_or_path, cache_dir=cache_dir), "quantization_config", None
    )
    method = (
        quantization.get("quant_method")
        if isinstance(quantization, dict)
        else getattr(quantization, "quant_method", None)
    )
    if str(getattr(method, "value", method)).lower() != "gptq":
        raise UserInputError(
            f"--auto_gptq: {model_name_or_path} is no GPTQ-quantised checkpoint (its config's quantization_config "
            "has no quant_method gptq); --auto_gptq trains LoRA on one"
        )


def _is_lora(peft_config: Any) -> bool:
    return type(peft_config).__name__ == "LoraConfig"


def _fast_moe_settings(settings: LoadSettings, fast_moe: Any, model_name_or_path: str, cache_dir: str | None) -> None:
    from transformers import AutoConfig

    counts = expert_counts(AutoConfig.from_pretrained(model_name_or_path, cache_dir=cache_dir))
    if counts is None:
        raise UserInputError(
            f"--fast_moe: {model_name_or_path} is no mixture-of-experts model (its config has no experts)"
        )
    experts, ranks, degree = counts[0], world_size(), fast_moe.ep_degree
    if experts % degree or ranks % degree:
        raise UserInputError(
            f"--fast_moe {degree}: the expert-parallel degree must divide the expert count ({experts} experts per "
            f"layer in {model_name_or_path}) and the world size ({ranks} processes)"
        )
    settings.keywords["experts_implementation"] = FAST_EXPERTS_IMPLEMENTATION
    settings.experts_implementation = FAST_EXPERTS_IMPLEMENTATION
    settings.ep_degree = degree
    if degree > 1:
        from transformers.distributed import DistributedConfig

        # The dense weights are sharded over all ranks, the experts over ``degree`` of them (each holds
        # experts / degree whole experts when ``degree`` is the world size).
        settings.keywords["distributed_config"] = DistributedConfig(ep_size=degree, fsdp_size=ranks)
