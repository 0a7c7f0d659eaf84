"""Will it fit: a job's peak tensor memory per device, predicted from its model's config alone, and the real peak
measured beside it.

``estimate_memory`` builds the job's model from its config on the meta device, gives it fake storage under torch's
``FakeTensorMode`` (no weight file is read, no memory is taken), wraps it as ``train()`` would (PEFT, gradient
checkpointing, TRL's fused LM head with its per-token entropy and accuracy) and runs two training steps (forward,
loss, backward, gradient clipping, the Trainer's own optimizer, ``zero_grad``), the second, with the optimizer state
in place, traced through torch's ``MemTracker``. The peak it reports is the tracker's, split into the tracker's
categories. What cannot be traced gives ``not_estimated`` with its reason, never a partial figure.

``PeakTensorMeter`` measures the real run: on a GPU ``torch.cuda.max_memory_allocated``; on a CPU the same tracker in
real mode over the first optimizer steps of the warmup (the measured steps carry no tracker cost).
"""

import contextlib
import copy
import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from transformers import TrainerCallback

logger = logging.getLogger(__name__)

MEASURED_STEPS = 2  # real steps the CPU meter tracks, from the first
TORCH_CHECK_SWITCH = "TRANSFORMERS_DISABLE_TORCH_CHECK"
FEW_LAYERS = 2  # a deep stack of alike layers is traced cut to this many and one more, then extended
# The tracker's categories (its enum members' names), as the dump's ``estimate.parts`` names them.
PARTS = {
    "PARAM": "parameters",
    "BUFFER": "buffers",
    "GRAD": "gradients",
    "OPT": "optimizer_state",
    "ACT": "activations",
    "TEMP": "temporaries",
    "OTH": "other",
    "INP": "inputs",
}
MAX_SUGGESTED_DEVICES = 4096


class NotEstimated(Exception):
    """What the estimate does not cover, in one line."""


def _tracker_class(base: type) -> type:
    """``base`` (torch's ``MemTracker`` or ``FSDPMemTracker``) made to accept frozen parameters (PEFT's base model):
    torch's tracker registers a gradient hook on every parameter, which torch refuses on one without gradients; this
    one hooks the trainable ones only. Everything else is torch's."""
    from torch.distributed._tools.mem_tracker import _MemRefType

    class FrozenAwareTracker(base):
        def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
            memory = super()._track_module_params_and_buffers(module, install_grad_hooks=False)
            if install_grad_hooks:
                for param in module.parameters():
                    if param.requires_grad and self._param_to_grad_hook_handles.get(param) is None:

                        def grad_hook(grad) -> None:
                            self._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)

                        self._param_to_grad_hook_handles[param] = (
                            param.register_hook(grad_hook),
                            param.register_post_accumulate_grad_hook(lambda p, hook=grad_hook: hook(p.grad)),
                        )
            return memory

    return FrozenAwareTracker


def memory_tracker():
    """torch's ``MemTracker``, accepting frozen parameters."""
    from torch.distributed._tools.mem_tracker import MemTracker

    return _tracker_class(MemTracker)()


def _part_name(kind: Any) -> str:
    """The dump's name of one of the tracker's categories, by its enum member's name (FSDP's own ones, e.g.
    SHARDED_PARAM, in lower case)."""
    name = getattr(kind, "name", None) or str(kind).rsplit(".", 1)[-1]
    return PARTS.get(name, name.lower())


def _peak(tracker) -> tuple[int, dict[str, int]]:
    """(peak bytes, the tracker's categories at that peak) over every device the tracker saw."""
    best, parts = 0, {}
    for snapshot in tracker.get_tracker_snapshot("peak").values():
        total = int(snapshot.get("Total", 0))
        if total >= best:
            best = total
            parts = {_part_name(kind): int(value) for kind, value in snapshot.items() if kind != "Total"}
    return best, parts


def _peak_module(tracker, peak: int) -> str | None:
    """The innermost module whose own peak is the step's: where the peak happened."""
    found = [
        stats.mod_fqn
        for stats in tracker.memory_tracking.values()
        if any(value >= peak for value in stats.local_peak.values())
    ]
    return max(found, key=lambda name: name.count("."), default=None)


@dataclasses.dataclass
class _Job:
    """What the estimate needs of a job's arguments."""

    model_path: str
    dtype: Any
    attention: str
    peft_config: Any
    batch_size: int
    seq_length: int
    padding_free: bool
    gradient_checkpointing: bool
    gradient_checkpointing_kwargs: dict | None
    reduce_loss_sum: bool
    load_keywords: dict
    sft_config: Any


def _job(args: Any) -> _Job:
    """The estimate's view of parsed arguments (``ParsedArguments``); ``NotEstimated`` for what it cannot trace."""
    import torch

    from tuning.sft_trainer import _attention_implementation, _to_sft_config
    from tuning.utils.acceleration import load_settings
    from tuning.utils.data_type_utils import get_torch_dtype

    model_args, train_args = args.model_args, args.training_args
    dtype = get_torch_dtype(model_args.torch_dtype)
    quantized = args.quantized_lora_config
    if getattr(quantized, "bnb_qlora", None) is not None or getattr(quantized, "auto_gptq", None) is not None:
        raise NotEstimated("quantized base model (--bnb_qlora/--auto_gptq): its kernels cannot run on fake tensors")
    load = load_settings(
        model_args.model_name_or_path,
        train_args.cache_dir,
        args.tune_config,
        dtype,
        quantized,
        args.fusedops_kernels_config,
        args.fast_moe_config,
    )
    if load.sharded:
        raise NotEstimated(f"--fast_moe {load.ep_degree}: experts sharded at load over ranks are not traced")
    if load.experts_implementation == "grouped_mm" and dtype != torch.bfloat16:
        raise NotEstimated(
            f"--fast_moe with --torch_dtype {model_args.torch_dtype}: torch's grouped_mm traces bfloat16 experts only"
        )
    if load.keywords.get("use_kernels"):
        raise NotEstimated("--fused_lora/--fast_kernels: hub kernels cannot run on fake tensors")
    packing = args.attention_and_distributed_packing_config
    padding_free = bool(packing is not None and packing.is_padding_free) or bool(train_args.packing)
    return _Job(
        model_path=model_args.model_name_or_path,
        dtype=dtype,
        attention=_attention_implementation(model_args, quiet=True),
        peft_config=args.tune_config,
        batch_size=train_args.per_device_train_batch_size,
        seq_length=_sequence_length(model_args, train_args),
        padding_free=padding_free,
        gradient_checkpointing=bool(train_args.gradient_checkpointing),
        gradient_checkpointing_kwargs=train_args.gradient_checkpointing_kwargs,
        reduce_loss_sum=bool(train_args.enable_reduce_loss_sum),
        load_keywords=dict(load.keywords),
        sft_config=_to_sft_config(train_args, train_args.max_seq_length),
    )


def _sequence_length(model_args: Any, train_args: Any) -> int:
    """``--max_seq_length``, capped at the tokenizer's ``model_max_length`` as ``train()`` caps it (uncapped when
    the model directory holds no tokenizer: a config-only directory)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            model_args.tokenizer_name_or_path or model_args.model_name_or_path, cache_dir=train_args.cache_dir
        )
    except (OSError, ValueError, TypeError):
        return train_args.max_seq_length
    return min(train_args.max_seq_length, tokenizer.model_max_length)


def _quantized_config(config: Any) -> str | None:
    quantization = getattr(config, "quantization_config", None)
    if quantization is None:
        return None
    method = quantization.get("quant_method") if isinstance(quantization, dict) else quantization.quant_method
    return str(getattr(method, "value", method))


def _build_model(job: _Job, config: Any):
    """The job's model, PEFT-wrapped and checkpointed as ``train()`` and TRL do, on the meta device."""
    import peft
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from trl.trainer.utils import add_fused_lm_head

    from tuning.config.peft_config import LoraConfig, PromptTuningConfig, to_peft_config
    from tuning.data.vision import is_vision_config
    from tuning.sft_trainer import vision_lora

    keywords = {k: v for k, v in job.load_keywords.items() if k == "experts_implementation"}
    model_class = AutoModelForImageTextToText if is_vision_config(config) else AutoModelForCausalLM  # as train()
    with torch.device("meta"):
        model = model_class.from_config(config, dtype=job.dtype, attn_implementation=job.attention, **keywords)
    if not job.reduce_loss_sum:  # TRL's loss and its per-token entropy and accuracy
        add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    peft_config = vision_lora(job.peft_config) if is_vision_config(config) else job.peft_config  # as train()
    if getattr(peft_config, "alora_invocation_string", None) is not None:
        peft_config = dataclasses.replace(peft_config)
        peft_config.alora_invocation_tokens = [0]  # which tokens activate it does not change what it holds
    if isinstance(peft_config, PromptTuningConfig):
        peft_config = dataclasses.replace(peft_config, prompt_tuning_init="RANDOM")  # no tokenizer needed
    if isinstance(peft_config, LoraConfig | PromptTuningConfig):
        tokens = getattr(peft_config, "alora_invocation_tokens", None)
        peft_config = to_peft_config(peft_config, job.model_path)
        if tokens is not None:
            peft_config.alora_invocation_tokens = tokens
        model = peft.get_peft_model(model, peft_config)
    if job.gradient_checkpointing:
        kwargs = dict(job.gradient_checkpointing_kwargs or {})
        kwargs.pop("selective", None)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None)
        if isinstance(model, peft.PeftModel):
            model.enable_input_require_grads()
    return model


def image_tokens(config: Any) -> int | None:
    """The tokens one image takes in a row of a vision-language model whose images all become the same number of
    features (LLaVA's: the tower's patches, and its class token where the features keep it); None for the others."""
    vision = getattr(config, "vision_config", None)
    if getattr(config, "model_type", None) != "llava" or vision is None:
        return None
    patches = (vision.image_size // vision.patch_size) ** 2
    return patches + (config.vision_feature_select_strategy == "full")


def _batch(job: _Job, config: Any) -> dict[str, Any]:
    """A worst-case batch of the job's shape, made under the fake mode: every row ``max_seq_length`` tokens, every
    token labelled; padding-free and packing as one row of the batch's tokens with its position ids. A LLaVA row
    holds one image (its pixels at the tower's size), its tokens after the first."""
    import torch

    if (per_image := image_tokens(config)) is not None:
        ids = torch.zeros((job.batch_size, job.seq_length), dtype=torch.long)
        ids[:, 1 : 1 + per_image] = config.image_token_index
        size = config.vision_config.image_size
        pixels = torch.zeros((job.batch_size, 3, size, size), dtype=job.dtype)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone(), "pixel_values": pixels}

    if job.padding_free:
        tokens = job.batch_size * job.seq_length
        ids = torch.zeros((1, tokens), dtype=torch.long)
        positions = torch.arange(job.seq_length).repeat(job.batch_size).unsqueeze(0)
        return {"input_ids": ids, "labels": ids.clone(), "position_ids": positions}
    ids = torch.zeros((job.batch_size, job.seq_length), dtype=torch.long)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def _step(model, optimizer, batch: dict[str, Any], job: _Job, mark: Callable[[str], None]) -> None:
    """One training step as the Trainer runs it with TRL's ``compute_loss`` (or ``--enable_reduce_loss_sum``'s)."""
    import torch

    if job.reduce_loss_sum:
        labels = batch["labels"]
        outputs = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False)
        logits = outputs.logits[:, -labels.shape[1] :, :]
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1, :].flatten(0, 1).float(), labels[:, 1:].flatten(), reduction="sum"
        )
    else:
        outputs = model(**batch, use_cache=False, fused_lm_head=True)
        loss = outputs.loss
        # TRL's metrics beside the loss: its entropy and token accuracy sums
        _ = (outputs.label_mask.sum(), outputs.entropy.detach().sum(), outputs.is_top1.sum())
    mark("forward")
    loss.backward()
    mark("backward")
    trainable = [param for param in model.parameters() if param.requires_grad]
    if job.sft_config.max_grad_norm and job.sft_config.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(trainable, job.sft_config.max_grad_norm)
    optimizer.step()
    model.zero_grad()
    mark("optimizer")


def estimate_memory(args: Any, devices: int | None = None) -> dict[str, Any]:
    """The job's peak tensor memory per device (``ParsedArguments`` ``args``), predicted without its weights: the
    dump's ``estimate`` object. ``devices``: how many devices the job runs on (default ``WORLD_SIZE``); with
    ``--fsdp`` the model is sharded over them. Never raises for what it cannot trace: ``not_estimated`` says why."""
    from tuning.utils.acceleration import world_size

    began = time.time()
    devices = devices or world_size()
    result = _result(args, devices)
    try:
        result.update(_estimate(args, devices))
        result["sequence_length"] = result.pop("_sequence_length", result["sequence_length"])
    except NotEstimated as exc:
        result["not_estimated"] = str(exc)
    except Exception as exc:  # a model whose code cannot run on fake tensors: its reason, never the job's failure
        logger.debug("memory estimate failed", exc_info=True)
        result["not_estimated"] = f"the training step cannot be traced: {type(exc).__name__}: {_one_line(exc)}"
    result["seconds"] = round(time.time() - began, 3)
    return result


def _result(args: Any, devices: int, not_estimated: str | None = None) -> dict[str, Any]:
    """An estimate object without a figure yet."""
    return {
        "peak_bytes_per_device": None,
        "parts": None,
        "peak_module": None,
        "peak_phase": None,
        "devices": devices,
        "batch_size": args.training_args.per_device_train_batch_size,
        "sequence_length": args.training_args.max_seq_length,
        "seconds": 0.0,
        "not_estimated": not_estimated,
    }


def failed_estimate(args: Any, devices: int, exc: BaseException) -> dict[str, Any]:
    """The estimate object of an estimate that failed outside the trace (a bad flag combination): its reason."""
    return _result(args, devices, f"{type(exc).__name__}: {_one_line(exc)}")


def _one_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]


def _estimate(args: Any, devices: int) -> dict[str, Any]:
    from transformers import AutoConfig

    from tuning.data.vision import is_vision_config

    job = _job(args)
    try:
        config = AutoConfig.from_pretrained(job.model_path, cache_dir=args.training_args.cache_dir)
    except (OSError, ValueError) as exc:
        raise NotEstimated(f"{job.model_path}: no readable config.json ({_one_line(exc)})") from exc
    if method := _quantized_config(config):
        raise NotEstimated(f"{job.model_path} is quantized ({method}): its kernels cannot run on fake tensors")
    if is_vision_config(config) and image_tokens(config) is None:
        raise NotEstimated(
            f"{type(config).__name__}: its image tokens per image depend on each image's size (tiles at any "
            "resolution), which the config alone does not give"
        )
    sharded = bool(args.training_args.fsdp)
    layers = _repeated_layers(config)
    if layers is None or sharded:
        return {**_traced(job, config, devices, sharded), "_sequence_length": job.seq_length}
    # A stack of identical decoder layers: what each layer adds (weights, gradients, optimizer state, saved
    # activations) is the difference between the model cut to FEW + 1 and to FEW layers; the rest (embeddings, head,
    # the loss's temporaries) is the same in both. The whole stack's figures are the cut model's and that difference
    # times the layers cut away: exact where the peak falls at the same point of the step in every depth.
    few, more = (_traced(job, _with_layers(config, count), devices, sharded) for count in (FEW_LAYERS, FEW_LAYERS + 1))
    extra = layers - FEW_LAYERS - 1

    def grown(low: int, high: int) -> int:
        return high + (high - low) * extra

    parts = {name: grown(few["parts"][name], more["parts"][name]) for name in more["parts"]}
    peak = grown(few["peak_bytes_per_device"], more["peak_bytes_per_device"])
    return {
        **more,
        "peak_bytes_per_device": peak,
        "parts": parts,
        "traced_layers": [FEW_LAYERS, FEW_LAYERS + 1],
        "_sequence_length": job.seq_length,
    }


def _traced(job: _Job, config: Any, devices: int, sharded: bool) -> dict[str, Any]:
    """The job's step traced on ``config``'s model (sharded over ``devices`` fake ranks with --fsdp)."""
    model = _build_model(job, config)
    with _fake_process_group(devices if sharded else None) as mesh, _value_checks_off(config):
        if mesh is not None:
            _shard(model, mesh)
        return _trace(model, job, config, mesh is not None)


@contextlib.contextmanager
def _value_checks_off(config: Any) -> Iterator[None]:
    """For a vision-language model, transformers' checks that read tensor values (its image tokens against its
    image features: equal by the batch's making) turned off while tracing, by the switch transformers documents
    (``TRANSFORMERS_DISABLE_TORCH_CHECK``): fake tensors have no values to read."""
    if image_tokens(config) is None:  # a text model, or one not traced
        yield
        return
    before = os.environ.get(TORCH_CHECK_SWITCH)
    os.environ[TORCH_CHECK_SWITCH] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TORCH_CHECK_SWITCH, None)
        else:
            os.environ[TORCH_CHECK_SWITCH] = before


def _repeated_layers(config: Any) -> int | None:
    """How many decoder layers the text model stacks, where they are alike and more than the cut model has: None
    when a list in the config describes the layers one by one (their kinds may differ), or for a shallow model."""
    text = config.get_text_config()
    layers = getattr(text, "num_hidden_layers", None)
    if not isinstance(layers, int) or layers <= FEW_LAYERS + 1 or text is not config:
        return None
    if any(isinstance(value, list | tuple) and len(value) == layers for value in text.to_dict().values()):
        return None
    return layers


def _with_layers(config: Any, layers: int) -> Any:
    cut = copy.deepcopy(config)
    cut.num_hidden_layers = layers
    return cut


def _trace(model, job: _Job, config: Any, sharded: bool) -> dict[str, Any]:
    """Fake storage for the model, then the two steps, the second traced (``FSDPMemTracker`` when ``sharded``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import Trainer

    with FakeTensorMode(allow_non_fake_inputs=True):
        model.to_empty(device="cpu")  # fake storage: nothing allocated, nothing read
        if config.get_text_config().tie_word_embeddings:
            (model.get_base_model() if hasattr(model, "get_base_model") else model).tie_weights()
        model.train()
        optimizer_class, optimizer_keywords = Trainer.get_optimizer_cls_and_kwargs(job.sft_config, model)
        trainable = [param for param in model.parameters() if param.requires_grad]
        optimizer = optimizer_class(trainable, **optimizer_keywords)
        batch = _batch(job, config)
        # The first step creates the optimizer state; the second, traced, runs with it in place: its peak is the
        # higher (the same work, the state resident throughout).
        _step(model, optimizer, batch, job, lambda phase: None)
        if sharded:
            from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

            tracker = FSDPMemTracker(model, optimizer)
            tracker.track_inputs(tuple(batch.values()))
        else:
            tracker = memory_tracker()
            tracker.track_external(model, optimizer, *batch.values())
        phases: list[tuple[str, int]] = []
        with tracker:
            _step(model, optimizer, batch, job, lambda phase: phases.append((phase, _peak(tracker)[0])))
        peak, parts = _peak(tracker)
        phase = next(name for name, value in phases if value >= peak)
        best = {
            "peak_bytes_per_device": peak,
            "parts": parts,
            "peak_phase": phase,
            "peak_module": _peak_module(tracker, peak) if phase != "optimizer" else type(optimizer).__name__,
        }
    return best


@contextlib.contextmanager
def _fake_process_group(devices: int | None) -> Iterator[Any]:
    """With ``devices``: a fake process group of that size (no communication, collectives only shaped) and its CPU
    device mesh, for FSDP's sharding; destroyed after. None: no process group."""
    if devices is None:
        yield None
        return
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    if dist.is_initialized():
        raise NotEstimated("--fsdp inside a running process group: estimate it with --estimate_memory, not torchrun")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=devices)
    try:
        yield init_device_mesh("cpu", (devices,))
    finally:
        dist.destroy_process_group()


def _shard(model, mesh) -> None:
    """FSDP2's ``fully_shard`` on every decoder layer (the model's ``_no_split_modules``, as FSDP's transformer
    auto-wrap policy wraps them), then on the whole model."""
    from torch.distributed.fsdp import fully_shard

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layer_classes = set(getattr(base, "_no_split_modules", None) or ())
    for module in list(model.modules()):
        if type(module).__name__ in layer_classes:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)


def format_estimate(estimate: dict[str, Any]) -> str:
    """The printed table of an estimate."""
    if estimate.get("not_estimated"):
        return f"not_estimated: {estimate['not_estimated']}"
    lines = [
        f"peak tensor memory per device: {_gib(estimate['peak_bytes_per_device'])} "
        f"({estimate['devices']} device(s), batch {estimate['batch_size']} x {estimate['sequence_length']} tokens, "
        f"{estimate['seconds']:.1f} s)",
        f"  at: {estimate['peak_phase']} of {estimate['peak_module']}",
    ]
    for name, value in sorted(estimate["parts"].items(), key=lambda item: -item[1]):
        if value:
            lines.append(f"  {name:<16} {_gib(value)}")
    return "\n".join(lines)


def format_suggestion(answer: dict[str, Any]) -> str:
    """The one line of ``suggest_devices``' answer."""
    memory = _gib(answer["device_memory_bytes"])
    if answer["devices"] is not None:
        return f"suggest_devices: {answer['devices']} device(s) of {memory}"
    reason = answer.get("reason") or answer["estimate"].get("not_estimated") or "too large for any device count tried"
    return f"suggest_devices: no device count of {memory} found: {reason}"


def _gib(value: int) -> str:
    return f"{value / 2**30:.3f} GiB" if value >= 2**28 else f"{value / 2**20:.2f} MiB"


def suggest_devices(args: Any, device_memory_bytes: int) -> dict[str, Any]:
    """The fewest devices of ``device_memory_bytes`` on which the job fits under its distributed setting: with
    ``--fsdp`` the model shards over them (the estimate per device count), else every device holds the whole job."""
    single = estimate_memory(args, devices=1)
    answer = {"device_memory_bytes": device_memory_bytes, "devices": None, "estimate": single}
    if single["not_estimated"]:
        return answer
    if single["peak_bytes_per_device"] <= device_memory_bytes:
        answer["devices"] = 1
        return answer
    if not args.training_args.fsdp:
        answer["reason"] = "without --fsdp every device holds the whole job: no device count makes it fit"
        return answer
    count = 2
    while count <= MAX_SUGGESTED_DEVICES:
        estimate = estimate_memory(args, devices=count)
        if estimate["not_estimated"]:
            answer["estimate"] = estimate
            return answer
        if estimate["peak_bytes_per_device"] <= device_memory_bytes:
            answer.update(devices=count, estimate=estimate)
            return answer
        count *= 2
    return answer


class PeakTensorMeter(TrainerCallback):
    """The run's real peak of live tensor bytes: on a GPU ``torch.cuda.max_memory_allocated`` since training began;
    on a CPU torch's tracker over the first ``MEASURED_STEPS`` optimizer steps as the Trainer runs them (each step's
    forward, loss, backward, clipping, optimizer and zero_grad), with the model, optimizer state and batches in
    place. ``peak_bytes``: the figure, None before it is known. ``on_measured(bytes)`` is called once it is."""

    def __init__(self, on_measured: Callable[[int], None] | None = None, steps: int = MEASURED_STEPS):
        self.on_measured = on_measured
        self.steps = steps
        self.peak_bytes: int | None = None
        self._tracker = None
        self._model = None
        self._optimizer = None
        self._tracked = 0
        self._cuda = False

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        import torch

        self._model, self._optimizer = model, optimizer
        self._cuda = torch.cuda.is_available() and next(model.parameters()).is_cuda
        if self._cuda:
            torch.cuda.reset_peak_memory_stats()

    def on_step_begin(self, args, state, control, **kwargs):
        if self._cuda or self._tracked >= self.steps or self._model is None:
            return
        self._tracker = memory_tracker()
        self._tracker.track_external(self._model, self._optimizer)
        self._tracker.__enter__()

    def on_step_end(self, args, state, control, **kwargs):
        if self._tracker is None:
            return
        tracker, self._tracker = self._tracker, None
        tracker.__exit__(None, None, None)
        self._tracked += 1
        self._set(max(self.peak_bytes or 0, _peak(tracker)[0]), done=self._tracked >= self.steps)

    def on_train_end(self, args, state, control, **kwargs):
        if self._tracker is not None:  # stopped mid-step: what it saw
            self.on_step_end(args, state, control)
        if self._cuda:
            import torch

            self._set(int(torch.cuda.max_memory_allocated()), done=True)

    def _set(self, value: int, done: bool) -> None:
        self.peak_bytes = value
        if done and self.on_measured is not None:
            self.on_measured(value)


def fits(estimate: dict[str, Any], device_memory_bytes: int | None) -> bool | None:
    """Whether the estimate fits the budget; None without a budget or an estimate."""
    peak = estimate.get("peak_bytes_per_device")
    if device_memory_bytes is None or peak is None:
        return None
    return peak <= device_memory_bytes


def visible_device_memory() -> int | None:
    """The first visible GPU's memory in bytes; None on a CPU machine."""
    import torch

    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(0).total_memory)


def gib_to_bytes(value: float) -> int:
    return int(math.floor(value * 2**30))
