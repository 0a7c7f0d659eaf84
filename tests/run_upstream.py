"""Run fms-hf-tuning's own test suite against this package, offline, on CPU:

    python -m tests.run_upstream UPSTREAM_CHECKOUT [--workdir DIR] [pytest arguments...]

UPSTREAM_CHECKOUT is a checkout of fms-hf-tuning (tag ``v3.1.0``). Its ``tests/``, with ``build/`` and ``scripts/``
(helpers its tests import), is copied to a work folder (never into this repository) and run by pytest with this
repository first on ``PYTHONPATH``, so ``import tuning`` is ours. Two stand-ins make it runnable here, both outside
the package: random weights for each shipped tiny model whose weights the checkout lacks (Git LFS), from the model's
own config; and TRL 0.x's ``DataCollatorForCompletionOnlyLM``, which TRL 1.x removed and upstream's data tests import
at their top (the cases that assert it fail, as documented in docs/cli-and-api.md). The exit status is pytest's.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# Loaded by pytest from the work folder's root, before upstream's tests are imported.
CONFTEST = '''"""Stand-ins for what upstream's tests import and TRL 1.x no longer has."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
import trl

if not hasattr(trl, "DataCollatorForCompletionOnlyLM"):

    class DataCollatorForCompletionOnlyLM:
        """Stand-in for TRL 0.x's collator, so that modules importing it can be collected."""

        def __init__(self, *args, **kwargs):
            raise NotImplementedError("TRL 1.x has no DataCollatorForCompletionOnlyLM")

    trl.DataCollatorForCompletionOnlyLM = DataCollatorForCompletionOnlyLM
'''


def _needs_weights(model_dir: Path) -> bool:
    """A model folder whose config is there but whose weights are absent, empty or a Git LFS pointer."""
    weights = model_dir / "model.safetensors"
    if not (model_dir / "config.json").is_file():
        return False
    return not weights.is_file() or weights.stat().st_size < 1024


def build_random_weights(model_dir: Path) -> None:
    """Random weights (seeded) for the causal LM that ``model_dir/config.json`` describes."""
    import torch
    from safetensors.torch import save_model
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    # save_model writes a tied weight once (3.2's tiny models tie their embeddings), as transformers saves it.
    save_model(model, str(model_dir / "model.safetensors"), metadata={"format": "pt"})


def prepare(upstream: Path, workdir: Path) -> None:
    """Copy upstream's tests into ``workdir`` with the stand-ins in place."""
    for folder in ("tests", "build", "scripts"):
        if (workdir / folder).exists():
            shutil.rmtree(workdir / folder)
        if (upstream / folder).is_dir():
            shutil.copytree(upstream / folder, workdir / folder)
    target = workdir / "tests"
    (workdir / "conftest.py").write_text(CONFTEST, encoding="utf-8")
    for config in sorted((target / "artifacts" / "language_models").glob("*/config.json")):
        if _needs_weights(config.parent):
            build_random_weights(config.parent)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("upstream", type=Path, help="a checkout of fms-hf-tuning (its tests/ is read)")
    parser.add_argument("--workdir", type=Path, default=None, help="where the tests are copied (default: a temp dir)")
    args, pytest_args = parser.parse_known_args(argv)
    if not (args.upstream / "tests").is_dir():
        parser.error(f"{args.upstream} has no tests/ folder")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="upstream-tests-"))
    workdir.mkdir(parents=True, exist_ok=True)
    prepare(args.upstream.resolve(), workdir)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *(pytest_args or ["tests"])]
    print(f"running upstream's tests in {workdir}: {' '.join(command[2:])}", flush=True)
    return subprocess.call(command, cwd=workdir, env=env)


if __name__ == "__main__":
    sys.exit(main())
