"""``make gpu-wheels``: the wheels the GPU check needs that the GPU machine lacks, in ``.whl/``, for a machine with no
network (benchmarks/gpu_device.sh installs them there).

Runs on any machine with the package registry and a recent pip (``make gpu-wheels`` makes one). pip resolves, for
CPython 3.12 on manylinux x86-64 and from metadata alone, what the check imports (``requirements.txt``, setup.py's
aim and nvml extras), with the GPU machine's versions (``benchmarks/gpu_machine_packages.txt``) as constraints; then
only what that list lacks is downloaded, one wheel per package. The folder must stay under ``--limit_mib`` (what
travels with the working tree). ``.whl/gpu_machine_closure.txt`` names the listed packages the check uses, at the
resolved versions: what ``make gpu-rehearsal`` installs from the registry in their place.
"""

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
MACHINE_PACKAGES = REPO_ROOT / "benchmarks" / "gpu_machine_packages.txt"
REQUIREMENTS, SETUP = REPO_ROOT / "requirements.txt", REPO_ROOT / "setup.py"
# setup.py's extras the check uses: bench_train's jobs track into a local Aim repo and sample NVML.
EXTRAS = ("aim", "nvml")
# pip's comment: a "#" opening the line or after whitespace, to the end of the line.
COMMENT = re.compile(r"(^|\s)#.*")
PYTHON_VERSION = "3.12"
# pip matches a manylinux tag exactly: any glibc from 2.28 on takes these (the GPU machine's was not read; its CUDA 13
# image's distribution is newer), and each package needed so far has a wheel for one of them.
PLATFORMS = tuple(f"manylinux_2_{minor}_x86_64" for minor in range(28, 4, -1))
PLATFORMS += ("manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64")
# Dependencies of what the check needs that no code of the check imports, left out of .whl/ (the 48 MiB it may hold).
SKIPPED = {
    "aim-ui": "the web UI of `aim up`, published as an sdist only",
    "boto3": "aim's S3 artifact storage; the check's runs log no artifacts",
}
CLOSURE_FILE = "gpu_machine_closure.txt"
LIMIT_MIB = 48


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def machine_packages(path: Path = MACHINE_PACKAGES) -> dict[str, str | None]:
    """The GPU machine's packages: canonical name to version, None where no version was read."""
    packages: dict[str, str | None] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.strip().partition("==")
            packages[canonical(name)] = version or None
    return packages


def requirement_lines(text: str) -> list[str]:
    """A requirements file's requirement strings, as pip reads them: comments (whole lines, or after a requirement)
    and blank lines left out."""
    lines = (COMMENT.sub("", line).strip() for line in text.splitlines())
    return [line for line in lines if line]


def setup_extras(path: Path = SETUP) -> dict[str, list[str]]:
    """setup.py's ``extras_require``, read from its source (importing setup.py would run setup())."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup"]
    return ast.literal_eval(next(kw.value for call in calls for kw in call.keywords if kw.arg == "extras_require"))


def requirements(requirements_file: Path = REQUIREMENTS, setup: Path = SETUP) -> list[str]:
    """What the check needs: requirements.txt's requirements and those of setup.py's ``EXTRAS``."""
    extras = setup_extras(setup)
    needs = requirement_lines(requirements_file.read_text(encoding="utf-8"))
    return needs + [need for extra in EXTRAS for need in extras[extra]]


def target_flags() -> list[str]:
    """pip's flags for the GPU machine's interpreter and platform, wheels only."""
    platforms = [flag for platform in PLATFORMS for flag in ("--platform", platform)]
    return ["--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp", *platforms]


def pip_report(arguments: list[str], constraints: dict[str, str], scratch: Path) -> list[dict[str, Any]]:
    """pip's installation report for ``arguments`` (requirements and flags) under ``constraints``: it resolves for the
    GPU machine from the index's metadata, downloading no wheel."""
    constraints_file, report = scratch / "constraints.txt", scratch / "report.json"
    constraints_file.write_text("".join(f"{name}=={version}\n" for name, version in constraints.items()))
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed"]
    command += ["--report", str(report), "--target", str(scratch / "target"), *target_flags()]
    subprocess.run([*command, "-c", str(constraints_file), *arguments], check=True)
    return json.loads(report.read_text())["install"]


def requirement_name(requirement: str) -> str:
    """The canonical name a requirement string begins with (``aim-ui==3.29.1; extra == 'x'`` names ``aim-ui``)."""
    return canonical(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip()).group())


def resolve(packages: dict[str, str | None], scratch: Path) -> dict[str, str]:
    """Every distribution the check needs, canonical name to version. A requirement that depends on a package in
    SKIPPED is pinned and its other dependencies (extras' aside) resolved in its place, leaving the skipped one out."""
    constraints = {name: version for name, version in packages.items() if version}
    wanted, pinned = requirements(), {}
    for top in pip_report(["--no-deps", *requirements()], constraints, scratch):
        name, needs = canonical(top["metadata"]["name"]), top["metadata"].get("requires_dist") or []
        if any(requirement_name(need) in SKIPPED for need in needs):
            wanted = [text for text in wanted if requirement_name(text) != name]
            wanted += [need for need in needs if requirement_name(need) not in SKIPPED and "extra ==" not in need]
            pinned[name] = top["metadata"]["version"]
    installs = pip_report(wanted, constraints, scratch)
    return {**{canonical(item["metadata"]["name"]): item["metadata"]["version"] for item in installs}, **pinned}


def download(missing: dict[str, str], folder: Path, scratch: Path) -> None:
    """Exactly these wheels in ``folder``: downloaded beside it, then in place of every wheel it held (two of one
    package would stop the install)."""
    wanted = [f"{name}=={version}" for name, version in sorted(missing.items())]
    downloads = scratch / "wheels"
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", *target_flags(), "-d", str(downloads)]
    subprocess.run([*command, *wanted], check=True)
    folder.mkdir(exist_ok=True)
    for wheel in folder.glob("*.whl"):
        wheel.unlink()
    for wheel in downloads.glob("*.whl"):
        shutil.move(wheel, folder / wheel.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default=str(REPO_ROOT / ".whl"), help="the wheel folder (%(default)s)")
    parser.add_argument("--limit_mib", type=float, default=LIMIT_MIB, help="largest folder size (%(default)s MiB)")
    args = parser.parse_args(argv)
    packages, folder = machine_packages(), Path(args.output)
    with tempfile.TemporaryDirectory(prefix="gpu-wheels-") as scratch:
        resolved = resolve(packages, Path(scratch))
        missing = {name: version for name, version in resolved.items() if name not in packages}
        download(missing, folder, Path(scratch))
    closure = "".join(sorted(f"{name}=={version}\n" for name, version in resolved.items() if name in packages))
    closure_file = folder / CLOSURE_FILE
    if not closure_file.exists() or closure_file.read_text(encoding="utf-8") != closure:
        closure_file.write_text(closure, encoding="utf-8")  # rewritten only when it changes: make rebuilds on it
    wheels = sorted(folder.glob("*.whl"))
    size_mib = sum(wheel.stat().st_size for wheel in wheels) / 2**20
    for wheel in wheels:
        print(f"{wheel.stat().st_size / 2**20:7.2f} MiB  {wheel.name}")
    print(f"{len(wheels)} wheels, {size_mib:.1f} MiB in {folder} (limit {args.limit_mib:g} MiB)")
    if absent := sorted(set(missing) - {canonical(wheel.name.split("-")[0]) for wheel in wheels}):
        print(f"gpu_wheels: no wheel of {', '.join(absent)} in {folder} after the download", file=sys.stderr)
        return 1
    if size_mib > args.limit_mib:
        print(f"gpu_wheels: {folder} holds {size_mib:.1f} MiB, over the {args.limit_mib:g} MiB limit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
