import re

from setuptools import find_packages, setup


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _requirements() -> list[str]:
    """requirements.txt's requirements: comments (whole lines, or after a requirement) and blank lines left out."""
    lines = (re.sub(r"(^|\s)#.*", "", line).strip() for line in _read("requirements.txt").splitlines())
    return [line for line in lines if line]


setup(
    name="tuning-bench",
    version="0.1.0",
    description="fms-hf-tuning compatible fine-tuning CLI with benchmark-grade tracking and error reports",
    long_description=_read("README.md"),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["tuning", "tuning.*"]),
    package_data={"tuning": ["config/*.json", "data/samples/*"]},
    install_requires=_requirements(),
    extras_require={
        # Aim's own AimCallback(log_system_params=True) imports pkg_resources, which setuptools 81 removed.
        "aim": ["aim>=3.29,<4", "setuptools<81"],
        "mlflow": ["mlflow>=3.17,<4"],
        "nvml": ["nvidia-ml-py>=12"],
        "plots": ["matplotlib>=3.7"],
        "qlora": ["bitsandbytes>=0.50,<0.51"],  # --bnb_qlora (4-bit base model; runs on CPU too)
        "ray": ["ray==2.60.0"],
        "dev": [
            "pytest>=8,<9.2",  # 9.2 moved the node id that pytest-xdist 3.8 suffixes for --dist loadgroup: groups split
            "pytest-xdist>=3.5",  # make test: one worker per core
            "ruff>=0.6",
            "aim>=3.29,<4",
            "setuptools<81",
            "mlflow>=3.17,<4",
            "matplotlib>=3.7",
            "ray==2.60.0",
            "py-spy>=0.4",  # benchmarks/overhead.py's profiled runs
            "bitsandbytes>=0.50,<0.51",  # the qlora extra: tests train QLoRA
        ],
    },
    entry_points={
        "console_scripts": [
            # Through tuning.launch, which installs the signal handlers before the trainer's heavy imports.
            "sft_trainer=tuning.launch:sft_trainer_main",
            "tuning-launch=tuning.launch:main",
        ]
    },
)
