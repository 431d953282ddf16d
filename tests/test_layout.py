"""The house's shape, checked: packages by stage on floors that import only downward, no import
cycle, no private name imported across packages or into tests, no oversized module.

CONTRIBUTING.md states these rules; this file is what keeps them true.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "userturn"
TOP_LEVEL_LIMIT = 10
LINE_LIMIT = 450  # a module past this holds more than one idea, unless listed below
HARD_LINE_LIMIT = 600
# One idea each, which a split would scatter (CONTRIBUTING.md says why for each).
ONE_IDEA: set[str] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path, known: set[str], name: str | None = None) -> set[str]:
    """Every userturn module ``path`` (module ``name``, by default found from its place in the
    package) imports, at the top or inside a function (a cycle through a function-level import is
    still a cycle: it only fails later)."""
    name = name or module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[: len(parent) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            # `from pkg import module` imports the module (the package's __init__ only runs
            # first); `from module import name` imports the module.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the userturn modules it imports, at the top or in a function. An import of a
    name from a parent package (``from userturn import __version__``) is an edge to that
    package's ``__init__``, like any other."""
    mods = modules()
    known = set(mods)
    return {name: imports_of(path, known) for name, path in mods.items()}


# The floors, top to bottom (CONTRIBUTING.md): a module imports only from its own package or
# from a package on a lower floor; nothing on one floor imports another package of that floor.
FLOORS: list[set[str]] = [
    {"userturn", "cli", "inspect"},         # what users call: the package, the CLI, Inspect
    {"api", "integrations", "train"},       # the notebook API, other tools, post-training
    {"config"},                             # the experiment: the stages' specs composed
    {"report"},                             # a run rendered
    {"probe"},                              # plan and generate
    {"labels"},                             # a case in, a label out
    {"backends", "store"},                  # engines; the run folder
    {"data", "chat"},                       # items; prompts
    {"stats"},                              # statistics over turns
    {"records", "credentials", "settings", "version"},  # values and shared checks
    {"taxonomy"},                           # the labels: one row each
    {"errors"},
]


def package_of(module: str) -> str:
    """``userturn.labels.stages`` -> ``labels``; the top-level package itself -> ``userturn``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def floor_of(package: str) -> int:
    found = [index for index, floor in enumerate(FLOORS) if package in floor]
    assert found, f"{package} is on no floor: add it to FLOORS and CONTRIBUTING.md"
    return found[0]


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Every import that does not run down the floors (or stay in its own package)."""
    found = []
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            here, there = package_of(name), package_of(target)
            if here != there and floor_of(there) <= floor_of(here):
                found.append(f"{name} -> {target} ({here} on floor {floor_of(here)}, {there} "
                             f"on floor {floor_of(there)})")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_counting_imports_inside_functions() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_check_finds_a_cycle_through_a_function_level_import(tmp_path: Path) -> None:
    graph = {"userturn.a": {"userturn.b"}, "userturn.b": {"userturn.c"}, "userturn.c": {"userturn.a"},
             "userturn.d": {"userturn.a"}}
    assert cycles(graph) == [["userturn.a", "userturn.b", "userturn.c"]]
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from userturn.store import lock\n")
    known = {"userturn.store", "userturn.store.lock"}
    assert "userturn.store.lock" in imports_of(source, known, name="userturn.m")


def test_imports_run_down_the_floors_counting_imports_inside_functions() -> None:
    assert upward_arrows(import_graph()) == []


def test_the_floor_check_finds_an_arrow_up_and_one_across_a_floor() -> None:
    graph = {"userturn.labels.judges": {"userturn.config", "userturn.labels.judge",
                                        "userturn.errors"},
             "userturn.store.meta": {"userturn.backends"},
             "userturn.probe.pipeline": {"userturn"}}
    assert upward_arrows(graph) == [
        "userturn.labels.judges -> userturn.config (labels on floor 5, config on floor 2)",
        "userturn.probe.pipeline -> userturn (probe on floor 4, userturn on floor 0)",
        "userturn.store.meta -> userturn.backends (store on floor 6, backends on floor 6)"]


def private_imports(path: Path, package: str | None) -> list[str]:
    """``from userturn.x import _name`` in ``path`` where the module it comes from is not in
    ``package`` (None: in tests, every userturn module is another's)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and not node.level and \
                (node.module or "").startswith("userturn"):
            source = package_of(node.module or "")
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__") and \
                        source != package:
                    found.append(f"{path.name}: from {node.module} import {alias.name}")
    return found


def test_no_private_name_is_imported_across_packages_or_into_tests() -> None:
    found = [hit for name, path in modules().items()
             for hit in private_imports(path, package_of(name))]
    tests = Path(__file__).parent
    found += [hit for path in sorted(tests.rglob("*.py")) for hit in private_imports(path, None)]
    assert found == []


def test_the_top_level_holds_at_most_ten_modules() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= TOP_LEVEL_LIMIT, top


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_module_is_oversized(name: str) -> None:
    lines = len(modules()[name].read_text(encoding="utf-8").splitlines())
    assert lines <= HARD_LINE_LIMIT, f"{name}: {lines} lines"
    if name not in ONE_IDEA:
        assert lines <= LINE_LIMIT, f"{name}: {lines} lines (split it, or list it in ONE_IDEA " \
                                    "with its reason in CONTRIBUTING.md)"


def test_only_report_and_cli_print() -> None:
    """Below report/ and cli/ nothing prints: no print(), no rich (Console, tables), no writes to
    sys.stdout or sys.stderr. The statistics compute (stats/), report/ renders, cli/ prints;
    a library stage that must say something takes a callback or logs."""
    def printing(source: str) -> list[str]:
        found = []
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id == "print":
                found.append(f"line {node.lineno}: print(")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "write" and isinstance(node.func.value, ast.Attribute) \
                    and isinstance(node.func.value.value, ast.Name) \
                    and node.func.value.value.id == "sys":
                found.append(f"line {node.lineno}: sys.{node.func.value.attr}.write(")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "rich":
                found.append(f"line {node.lineno}: from {node.module} import")
            elif isinstance(node, ast.Import) and any(a.name.split(".")[0] == "rich"
                                                      for a in node.names):
                found.append(f"line {node.lineno}: import rich")
        return found

    # The check itself finds each way of printing, inside functions too.
    assert len(printing("import sys\ndef f():\n    print('x')\n    sys.stderr.write('x')\n"
                        "    from rich.console import Console\nimport rich.table\n")) == 4
    offenders = {name: found for name, path in modules().items()
                 if name.split(".")[1:2] not in (["report"], ["cli"])
                 and (found := printing(path.read_text(encoding="utf-8")))}
    assert offenders == {}


def test_a_stored_experiment_is_read_through_its_specs_not_by_string_key() -> None:
    """A run's ``meta.config`` is read back typed (``ProbePlan.stored(meta.config)`` and the
    other specs' ``stored``): a key renamed in a spec then fails in one place, not in a reader."""
    found = [f"{name}:{node.lineno}" for name, path in modules().items()
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if _reads_stored_config_by_key(node)]
    assert found == []


def _meta_config(node: ast.AST) -> bool:
    """``meta.config`` or ``<anything>.meta.config``: a run's stored experiment."""
    return (isinstance(node, ast.Attribute) and node.attr == "config"
            and (isinstance(node.value, ast.Name) and node.value.id == "meta"
                 or isinstance(node.value, ast.Attribute) and node.value.attr == "meta"))


def _reads_stored_config_by_key(node: ast.AST) -> bool:
    """``meta.config[...]`` or ``meta.config.get(...)``, however ``meta`` is reached."""
    if isinstance(node, ast.Subscript):
        return _meta_config(node.value)
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get" and _meta_config(node.func.value))
