"""Non-padding tokens per optimizer step, without the trainer's device sync and collective per micro-batch: a forward
pre-hook sums each training micro-batch's attention mask where it lies; at the step's end the sums are all-reduced
once and copied to the host without blocking, to be read once there (``ready``) or when training ends. A
vision-language model's image tokens are counted apart as well (they are among the non-padding tokens), and so are
the label tokens the step trained on (``add_label_tokens``: the trainer counts them in each step's batches). The
rank's own tokens ride along in the same copy, outside the all-reduce, for its throughput (``rank_tokens``).
"""

from collections import deque
from typing import Any

import torch
import torch.distributed as dist

StepTokens = tuple[int, float, int]  # (optimizer step, its duration in seconds, tokens over all ranks)


class StepTokenCounter:
    """Counts the tokens every training forward pass of ``model`` receives, per optimizer step. With
    ``image_token_id`` (a vision-language model's), the image tokens among them are counted apart too: ``ready``
    then notes each step's image tokens in ``image_tokens`` (step → count over all ranks). The label tokens given
    to ``add_label_tokens`` are noted the same way in ``label_tokens``, and this rank's own tokens in
    ``rank_tokens``."""

    def __init__(self, model: torch.nn.Module, device: torch.device, image_token_id: int | None = None):
        self._device = device  # where a step's count goes for the all-reduce when it has none on a device
        self._world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self._image_token_id = image_token_id
        self.image_tokens: dict[int, int] = {}
        self.label_tokens: dict[int, int] = {}
        self.rank_tokens: dict[int, int] = {}
        # (tokens, image tokens, label tokens) counted on the host: CPU masks, rows without a mask
        self._host_counts = [0, 0, 0]
        self._device_counts: list[torch.Tensor] = []  # (tokens, image tokens, label tokens) still on an accelerator
        # (step, duration, counts known on the host, the host copy of a device total, the event of that copy)
        self._pending: deque[tuple[int, float, list[int], torch.Tensor | None, Any]] = deque()
        self._handle = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if not module.training:
            return  # evaluation
        mask = kwargs.get("attention_mask")
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        images = None
        if self._image_token_id is not None and isinstance(input_ids, torch.Tensor):
            is_image = input_ids == self._image_token_id
            images = (is_image if mask is None else is_image & mask.bool()).sum(dtype=torch.int64)
        if mask is None:
            if isinstance(input_ids, torch.Tensor):  # no mask, no padding (e.g. packed rows): every token counts
                self._host_counts[0] += input_ids.numel()
                self._host_counts[1] += 0 if images is None else int(images)
        elif mask.is_cpu:
            self._host_counts[0] += int(mask.sum())
            self._host_counts[1] += 0 if images is None else int(images)
        else:
            tokens = mask.sum(dtype=torch.int64)
            none = tokens.new_zeros(())
            self._device_counts.append(torch.stack([tokens, none if images is None else images, none]))

    def add_label_tokens(self, count: torch.Tensor | int) -> None:
        """Add ``count`` label tokens (a tensor where it lies, read at the step's end) to the step being trained."""
        if isinstance(count, torch.Tensor) and not count.is_cpu:
            none = count.new_zeros((), dtype=torch.int64)
            self._device_counts.append(torch.stack([none, none, count.to(torch.int64)]))
        else:
            self._host_counts[2] += int(count)

    def end_step(self, step: int, duration: float) -> None:
        """Close the step's count; every rank calls this once per optimizer step (it all-reduces)."""
        host_counts, self._host_counts = self._host_counts, [0, 0, 0]
        if self._world_size == 1 and not self._device_counts:
            self._pending.append((step, duration, [*host_counts, host_counts[0]], None, None))
            return
        if self._device_counts:
            counts = torch.stack(self._device_counts).sum(dim=0) + torch.tensor(host_counts, device=self._device)
            self._device_counts = []
        else:
            counts = torch.tensor(host_counts, dtype=torch.int64, device=self._device)
        total = torch.cat([counts, counts[:1]])  # the totals to all-reduce, then this rank's own tokens
        if self._world_size > 1:
            dist.all_reduce(total[:3])
        if total.is_cuda:
            host = torch.empty(4, dtype=torch.int64, pin_memory=True)
            host.copy_(total, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
            self._pending.append((step, duration, [0, 0, 0, 0], host, copied))
        else:
            self._pending.append((step, duration, total.tolist(), None, None))

    def ready(self, wait: bool = False) -> list[StepTokens]:
        """The steps whose totals have reached the host, oldest first; ``wait`` waits for all of them."""
        done: list[StepTokens] = []
        while self._pending:
            step, duration, counts, host, copied = self._pending[0]
            if copied is not None and not copied.query():
                if not wait:
                    break
                copied.synchronize()
            self._pending.popleft()
            tokens, images, labels, own = counts if host is None else host.tolist()
            if self._image_token_id is not None:
                self.image_tokens[step] = images
            self.label_tokens[step] = labels
            self.rank_tokens[step] = own
            done.append((step, duration, tokens))
        return done

    def detach(self) -> None:
        self._handle.remove()
