"""What each of fms-acceleration's features needs that this machine may lack, named for the refusal rule
(``tuning.config.unsupported``: a flag whose feature lacks something here is refused, naming it) and for the loading
(``tuning.utils.acceleration``). Torch is imported only to ask for a CUDA device."""

import importlib.util
import sys

QLORA_EXTRA = "pip install 'tuning-bench[qlora]'"


def _absent(*modules: str) -> list[str]:
    """The modules that cannot be imported here: not installed, or blocked (None in ``sys.modules``)."""
    return [name for name in modules if sys.modules.get(name, ...) is None or importlib.util.find_spec(name) is None]


def _no_cuda() -> list[str]:
    import torch

    return [] if torch.cuda.is_available() else ["a CUDA GPU"]


def bitsandbytes_missing() -> list[str]:
    """QLoRA's needs: bitsandbytes (the 'qlora' extra), which runs on CPU too."""
    return [f"bitsandbytes ({QLORA_EXTRA})"] if _absent("bitsandbytes") else []


def gptq_missing() -> list[str]:
    """GPTQ LoRA's needs: transformers' GPTQ integration runs on optimum and gptqmodel, whose kernels are CUDA's."""
    return _absent("gptqmodel", "optimum") + _no_cuda()


def kernels_missing() -> list[str]:
    """Fused kernels' needs: transformers' kernels integration (the ``kernels`` library) and a CUDA GPU."""
    return _absent("kernels") + _no_cuda()
