"""The house's shape, checked: packages by stage, no import cycle, no oversized module.

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
            # `from pkg import module` imports the module; `from module import name` the module.
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    graph = {name: imports_of(path, known) for name, path in mods.items()}
    # Importing a package's module runs the package's __init__ first: that is no cycle of ours.
    return {name: {t for t in targets if not name.startswith(t + ".")}
            for name, targets in graph.items()}


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
