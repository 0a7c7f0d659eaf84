"""The stand-in NVML (``tests/helpers/fake_nvml/pynvml.py``): GPUs described as JSON, for this process and, through
PYTHONPATH, for jobs."""

from pathlib import Path
from types import ModuleType

from tests.helpers.training import load_script

FAKE_NVML_DIR = Path(__file__).resolve().parent / "fake_nvml"


def load_fake_nvml() -> ModuleType:
    """A fresh copy of the stand-in module, so no state leaks between tests."""
    return load_script(FAKE_NVML_DIR / "pynvml.py")
