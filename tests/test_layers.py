"""The package's layers run one way: a module imports only from its own floor or the floors below it (docs: the
layout in README.md's documentation table). Read from the source, every import counted, those inside functions and
type-checking blocks too."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tuning"

# Ground floor first. A module is on the floor of its first matching prefix.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("tuning.errors",),
    ("tuning.config",),
    ("tuning.utils",),
    ("tuning.data", "tuning.trackers", "tuning.trainer"),
    ("tuning.prologue",),
    ("tuning.sft_trainer",),
    ("tuning.benchmarking", "tuning.launch"),
    ("tuning",),  # the package's face: its lazy names reach every floor
)
# Same-floor neighbours that must not lean on each other either.
APART = (("tuning.data", "tuning.trackers"),)


def floor(module: str) -> int:
    for number, prefixes in enumerate(FLOORS):
        if any(module == prefix or (prefix != "tuning" and module.startswith(prefix + ".")) for prefix in prefixes):
            return number
    raise AssertionError(f"{module} is on no floor: add it to FLOORS")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST, package: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against the importing package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                names.add(".".join([*base, node.module] if node.module else base))
            elif node.module:
                names.add(node.module)
    return {name for name in names if name.split(".")[0] == "tuning" and name != "tuning"}


MODULES = sorted(path for path in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(PACKAGE.parent)))
def test_imports_run_down_the_floors(path):
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = imported(ast.parse(path.read_text(encoding="utf-8")), package)
    upward = sorted(target for target in targets if floor(target) > floor(name))
    assert not upward, f"{name} (floor {floor(name)}) imports from above: {upward}"
    for left, right in APART:
        for mine, theirs in ((left, right), (right, left)):
            if name.startswith(mine):
                assert not [t for t in targets if t.startswith(theirs)], f"{name} imports from {theirs}"


def test_the_floors_check_sees_an_upward_import():
    """The check itself: an import from a higher floor is found."""
    tree = ast.parse("def f():\n    from tuning.trackers import start_helpers\n")
    assert floor(next(iter(imported(tree, "tuning.utils")))) > floor("tuning.utils.prologue")


def import_graph() -> dict[str, set[str]]:
    """Each module's imports of the package's modules (a name that is no module, as ``from tuning.data import x``'s
    package ``tuning.data``, stands for the package's ``__init__``)."""
    graph = {}
    for path in MODULES:
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = imported(ast.parse(path.read_text(encoding="utf-8")), package)
    return {name: {target for target in targets if target in graph} for name, targets in graph.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of two or more modules that import each other, directly or around (strongly connected)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in graph:
        if module not in index:
            visit(module)
    return found


def test_no_modules_import_each_other_around_a_circle():
    """Within a floor too: a circle ties its modules into one, whichever floor they are on (lazy imports count)."""
    assert circles(import_graph()) == []


def test_the_circle_check_sees_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


TESTS = PACKAGE.parent / "tests"
REGISTRY = "tuning.trackers.tracker_factory"


def test_a_test_module_imports_helpers_only_from_tests_helpers():
    """Shared test code lives in tests/helpers/ (fixtures in conftest.py): a test module never imports another."""
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        if wrong := sorted(n for n in names if n.startswith("tests.") and not n.startswith("tests.helpers")):
            found[str(path.relative_to(TESTS.parent))] = wrong
    assert found == {}


def test_trackers_import_nothing_from_the_registry():
    """The registry (tracker_factory, and the package that re-exports it) knows the trackers; a tracker does not know
    the registry."""
    trackers = [path for path in MODULES if path.parent.name == "trackers" and path.name != "__init__.py"]
    assert len(trackers) > 5
    found = {}
    for path in trackers:
        if (name := module_name(path)) != REGISTRY:
            targets = imported(ast.parse(path.read_text(encoding="utf-8")), name.rpartition(".")[0])
            if wrong := sorted(t for t in targets if t in (REGISTRY, "tuning.trackers")):
                found[name] = wrong
    assert found == {}
