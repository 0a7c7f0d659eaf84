"""tuning-bench: fms-hf-tuning compatible fine-tuning with benchmark-grade tracking and error reports."""

import logging

# bitsandbytes (the qlora extra), imported by peft and transformers whenever it is installed, tries on CPUs with
# AVX512-BF16 to fetch an optional 4-bit kernel from the Hugging Face Hub, and the kernels library and it warn when
# that cannot be (offline, or a publisher it cannot verify); it then runs its own code, so those lines say nothing
# about a run: only their errors are shown.
for _logger in ("bitsandbytes.backends.cpu.ops", "kernels._internals.hf_hub"):
    logging.getLogger(_logger).setLevel(logging.ERROR)


def __getattr__(name: str):
    # `train` pulls in torch, transformers and TRL: imported when asked, so that light users of the package start fast.
    if name == "train":
        from tuning.sft_trainer import train

        return train
    raise AttributeError(f"module 'tuning' has no attribute {name!r}")


__all__ = ["train"]
