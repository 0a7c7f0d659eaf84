"""The README and the docs pages link to each other: every relative link and #anchor points at something that exists."""

import re
from pathlib import Path

import pytest

from tests.helpers.training import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```$", re.DOTALL | re.MULTILINE)
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.MULTILINE)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than ``-`` and ``_`` dropped, spaces as ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {anchor(heading) for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8")))}


def relative_links(page: Path) -> list[str]:
    """The page's links outside code blocks that are neither absolute URLs nor mail addresses."""
    links = LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8")))
    return [link for link in links if not re.match(r"[a-z][a-z0-9+.-]*:", link)]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves(page: Path):
    broken = []
    for link in relative_links(page):
        path_part, _, fragment = link.partition("#")
        target = (page.parent / path_part).resolve() if path_part else page
        if not target.exists():
            broken.append(f"{link}: no {target.relative_to(REPO_ROOT)}")
        elif fragment and target.suffix == ".md" and fragment not in anchors(target):
            broken.append(f"{link}: no heading #{fragment} in {target.relative_to(REPO_ROOT)}")
    assert not broken, f"{page.relative_to(REPO_ROOT)}: " + "; ".join(broken)


def test_the_readme_stays_short_and_links_every_docs_page():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    linked = {Path(link.partition("#")[0]).name for link in relative_links(REPO_ROOT / "README.md")}
    assert {page.name for page in PAGES[1:]} <= linked


def test_anchor_follows_github():
    assert anchor("Benchmark runs: `wrappers/bench_train.py`") == "benchmark-runs-wrappersbench_trainpy"
    assert anchor("On a GPU: `make gpu-check`") == "on-a-gpu-make-gpu-check"
