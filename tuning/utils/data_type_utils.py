"""torch dtypes from the strings users type (``--torch_dtype bfloat16``) or the dtypes Python callers pass."""

import torch

from tuning.utils.error_logging import UserInputError


def str_to_torch_dtype(dtype_str: str) -> torch.dtype:
    """The torch dtype named ``dtype_str`` (``bfloat16``, ``float32``...); a ``UserInputError`` for anything else."""
    dtype = getattr(torch, dtype_str, None) if isinstance(dtype_str, str) else None
    if not isinstance(dtype, torch.dtype):
        raise UserInputError(
            f"Unrecognized data type of a torch.Tensor: {dtype_str!r} (e.g. bfloat16, float16, float32)"
        )
    return dtype


def get_torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``dtype`` itself when it is a torch dtype, else the dtype its name denotes (see ``str_to_torch_dtype``)."""
    return dtype if isinstance(dtype, torch.dtype) else str_to_torch_dtype(dtype)
