"""tuning-bench: fms-hf-tuning compatible fine-tuning with benchmark-grade tracking and error reports."""


def __getattr__(name: str):
    # `train` pulls in torch, transformers and TRL: imported when asked, so that light users of the package start fast.
    if name == "train":
        from tuning.sft_trainer import train

        return train
    raise AttributeError(f"module 'tuning' has no attribute {name!r}")


__all__ = ["train"]
