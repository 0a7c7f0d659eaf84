"""What the GPU path (benchmarks/gpu_wheels.py, gpu_device.sh, gpu_check.py) reads from the project's files, read here
in the fast tier the way those scripts read it: a lent GPU machine must never be the first to find a line they cannot
take."""

import re
import shlex

from packaging.requirements import Requirement

from benchmarks import gpu_check
from tests.helpers.training import REPO_ROOT, load_script
from tuning.benchmarking.job import load_callbacks

GPU_WHEELS = load_script(REPO_ROOT / "benchmarks" / "gpu_wheels.py")


def test_every_requirement_gpu_wheels_builds_is_a_valid_requirement():
    """requirements.txt and setup.py's aim and nvml extras, as pip gets them from gpu_wheels.py."""
    needs = GPU_WHEELS.requirements()
    names = {Requirement(need).name for need in needs}  # raises InvalidRequirement on a line pip would refuse
    assert {"torch", "pillow", "aim", "nvidia-ml-py"} <= names and len(names) == len(needs)


def test_comments_markers_and_blank_lines_are_read_as_pip_reads_them(tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(
        "# a comment line\n"
        "torch>=2.4,<2.14  # an inline comment\n"
        "\n"
        "   \n"
        "pkg[extra]>=1; python_version >= '3.11'\t# a marker, then a comment\n"
        "wheel @ https://example.com/wheel-1.0-py3-none-any.whl#sha256=00ff\n",
        encoding="utf-8",
    )
    setup = tmp_path / "setup.py"
    setup.write_text(
        "from setuptools import setup\n\n"
        "setup(name='x', extras_require={'aim': ['aim>=3.29,<4'], 'nvml': ['nvidia-ml-py>=12'], 'ray': ['ray']})\n",
        encoding="utf-8",
    )
    needs = GPU_WHEELS.requirements(requirements, setup)
    assert needs == [
        "torch>=2.4,<2.14",
        "pkg[extra]>=1; python_version >= '3.11'",
        "wheel @ https://example.com/wheel-1.0-py3-none-any.whl#sha256=00ff",  # a '#' inside a URL is no comment
        "aim>=3.29,<4",
        "nvidia-ml-py>=12",
    ]
    assert [str(Requirement(need).marker) for need in needs if Requirement(need).marker] == ['python_version >= "3.11"']


def test_the_device_script_s_check_flags_parse_and_name_what_exists():
    """gpu_device.sh's --quick and --rehearsal flags are gpu_check.py's, with valid values; the rehearsal's OOM
    callback imports and its NVML stand-in is where the script puts it on PYTHONPATH."""
    script = (REPO_ROOT / "benchmarks" / "gpu_device.sh").read_text(encoding="utf-8")
    modes = {mode: shlex.split(flags) for mode, flags in re.findall(r"(\w+)\) mode_flags=\((.*?)\) ;;", script, re.S)}
    assert set(modes) == {"quick", "rehearsal"}
    for flags in modes.values():
        gpu_check.parse_args(flags)  # argparse exits 2 on a flag or value it does not take
    rehearsal = gpu_check.parse_args(modes["rehearsal"])
    assert rehearsal.cpu_rehearsal and load_callbacks(rehearsal.oom_callbacks)
    assert '"$PWD/tests/helpers/fake_nvml:' in script and (REPO_ROOT / "tests" / "helpers" / "fake_nvml").is_dir()
