"""Non-padding tokens per optimizer step, without the trainer's device sync and collective per micro-batch: a forward
pre-hook sums each training micro-batch's attention mask where it lies; at the step's end the sums are all-reduced
once and copied to the host without blocking, to be read once there (``ready``) or when training ends.
"""

from collections import deque
from typing import Any

import torch
import torch.distributed as dist

StepTokens = tuple[int, float, int]  # (optimizer step, its duration in seconds, tokens over all ranks)


class StepTokenCounter:
    """Counts the tokens every training forward pass of ``model`` receives, per optimizer step."""

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self._device = device  # where a step's count goes for the all-reduce when it has none on a device
        self._world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self._host_tokens = 0  # counted on the host: CPU masks, and rows without a mask
        self._device_counts: list[torch.Tensor] = []  # sums still on an accelerator
        # (step, duration, tokens known on the host, the host copy of a device total, the event of that copy)
        self._pending: deque[tuple[int, float, int, torch.Tensor | None, Any]] = deque()
        self._handle = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if not module.training:
            return  # evaluation
        mask = kwargs.get("attention_mask")
        if mask is None:
            input_ids = kwargs.get("input_ids", args[0] if args else None)
            if isinstance(input_ids, torch.Tensor):  # no mask, no padding (e.g. packed rows): every token counts
                self._host_tokens += input_ids.numel()
        elif mask.is_cpu:
            self._host_tokens += int(mask.sum())
        else:
            self._device_counts.append(mask.sum(dtype=torch.int64))

    def end_step(self, step: int, duration: float) -> None:
        """Close the step's count; every rank calls this once per optimizer step (it all-reduces)."""
        host_tokens, self._host_tokens = self._host_tokens, 0
        if self._world_size == 1 and not self._device_counts:
            self._pending.append((step, duration, host_tokens, None, None))
            return
        if self._device_counts:
            total = torch.stack(self._device_counts).sum() + host_tokens
            self._device_counts = []
        else:
            total = torch.tensor(host_tokens, dtype=torch.int64, device=self._device)
        if self._world_size > 1:
            dist.all_reduce(total)
        if total.is_cuda:
            host = torch.empty((), dtype=torch.int64, pin_memory=True)
            host.copy_(total, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
            self._pending.append((step, duration, 0, host, copied))
        else:
            self._pending.append((step, duration, int(total), None, None))

    def ready(self, wait: bool = False) -> list[StepTokens]:
        """The steps whose totals have reached the host, oldest first; ``wait`` waits for all of them."""
        done: list[StepTokens] = []
        while self._pending:
            step, duration, tokens, host, copied = self._pending[0]
            if copied is not None and not copied.query():
                if not wait:
                    break
                copied.synchronize()
            self._pending.popleft()
            done.append((step, duration, tokens if host is None else int(host)))
        return done

    def detach(self) -> None:
        self._handle.remove()
