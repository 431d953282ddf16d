"""The house's shape, checked: packages by stage on floors that import only downward, no import
cycle, no private name reached across packages or from tests (imported, relatively too, or read
as an attribute), no oversized module, a stored experiment read only through its specs, SQLite
only in the store, and a thin ``cli/main.py``. Each check is also shown to find what it forbids.

CONTRIBUTING.md states these rules; this file is what keeps them true.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Callable

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "userturn"
TOP_LEVEL_LIMIT = 10
LINE_LIMIT = 450  # a module past this holds more than one idea, unless listed below
HARD_LINE_LIMIT = 600
CLI_MAIN_LIMIT = 250  # cli/main.py: the parser and the exit policy, nothing else
# One idea each, which a split would scatter (CONTRIBUTING.md says why for each).
ONE_IDEA: set[str] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def package_path(name: str, path: Path) -> str:
    """The package relative imports in module ``name`` (file ``path``) start from."""
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imported_from(node: ast.ImportFrom, package: str) -> str:
    """The absolute module of ``from MODULE import ...``, a relative one resolved from
    ``package`` (``from ..store import x`` in ``userturn.labels`` -> ``userturn.store``)."""
    base = node.module or ""
    if not node.level:
        return base
    parent = package.split(".")
    parent = parent[: len(parent) - node.level + 1]
    return ".".join([*parent, base] if base else parent)


def imports_of(path: Path, known: set[str], name: str | None = None) -> set[str]:
    """Every userturn module ``path`` (module ``name``, by default found from its place in the
    package) imports, at the top or inside a function (a cycle through a function-level import is
    still a cycle: it only fails later)."""
    name = name or module_name(path)
    package = package_path(name, path)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = imported_from(node, package)
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


# Names with a leading underscore that are public API all the same (a NamedTuple's methods).
NAMED_TUPLE_API = frozenset({"_asdict", "_replace", "_fields", "_field_defaults", "_make"})
# Calls that reach an attribute named by a string: getattr(module, "_name"),
# monkeypatch.setattr(module, "_name", ...), mock.patch("userturn.x._name").
ATTRIBUTE_CALLS = frozenset({"getattr", "setattr", "hasattr", "delattr", "patch"})


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in NAMED_TUPLE_API


def private_uses(source: str, module: str | None, known: set[str], *,
                 package: str | None = None) -> list[str]:
    """Every private name of another package's module that ``source`` reaches. ``module``: the
    module's name (None: a test, to which every userturn module is another's); ``package``:
    where its relative imports start (default: ``module``'s parent); ``known``: the userturn
    modules. A name is reached when it is imported (``from userturn.x import _name``, or
    relatively, ``from ..x import _name``), read as an attribute of an imported module or of a
    name imported from one (``d._name`` after ``import userturn.store.database as d`` or ``from
    . import records``; ``database.RunStore._name``), or named as a string to getattr,
    setattr, hasattr, delattr or patch (``monkeypatch.setattr(atomic, "_name", ...)``), at the
    top or inside a function."""
    own = package_of(module) if module else None
    start = package if package is not None else (module or "").rpartition(".")[0]
    tree = ast.parse(source)
    found: list[str] = []
    # Local name -> (the userturn module it is, or is in; the attributes after that module).
    bound: dict[str, tuple[str, list[str]]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "userturn" or alias.name.startswith("userturn."):
                    bound[alias.asname or "userturn"] = (alias.name if alias.asname else
                                                         "userturn", [])
        elif isinstance(node, ast.ImportFrom):
            base = imported_from(node, start)
            if not (base == "userturn" or base.startswith("userturn.")):
                continue
            for alias in node.names:
                if is_private(alias.name) and package_of(base) != own:
                    found.append(f"line {node.lineno}: from {base} import {alias.name}")
                full = f"{base}.{alias.name}"
                bound[alias.asname or alias.name] = (full, []) if full in known else (
                    base, [alias.name])

    def module_reached(expr: ast.expr) -> str | None:
        """The userturn module whose namespace ``expr`` reads (None: not one)."""
        attributes: list[str] = []
        while isinstance(expr, ast.Attribute):
            attributes.insert(0, expr.attr)
            expr = expr.value
        if not isinstance(expr, ast.Name) or expr.id not in bound:
            return None
        reached, rest = bound[expr.id]
        parts = [*rest, *attributes]
        while parts and f"{reached}.{parts[0]}" in known:  # into submodules, as far as they go
            reached = f"{reached}.{parts.pop(0)}"
        return reached

    def dotted_module(path: str) -> str | None:
        """``userturn.store.atomic._fsync`` -> ``userturn.store.atomic`` (None: not userturn's
        or not private)."""
        parts = path.split(".")
        if parts[0] != "userturn" or not any(is_private(part) for part in parts):
            return None
        reached = "userturn"
        for part in parts[1:]:
            if f"{reached}.{part}" not in known:
                break
            reached = f"{reached}.{part}"
        return reached

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            reached = module_reached(node.value)
            if reached is not None and package_of(reached) != own:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and node.args and _called(node.func) in ATTRIBUTE_CALLS:
            first, second = node.args[0], node.args[1] if len(node.args) > 1 else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                reached = dotted_module(first.value)
            elif (isinstance(second, ast.Constant) and isinstance(second.value, str)
                  and is_private(second.value)):
                reached = module_reached(first)
            else:
                continue
            if reached is not None and package_of(reached) != own:
                found.append(f"line {node.lineno}: {ast.unparse(node.func)}(...)")
    return found


def _called(func: ast.expr) -> str | None:
    """``getattr`` of ``getattr(...)``, ``setattr`` of ``monkeypatch.setattr(...)``."""
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def private_uses_of(path: Path, module: str | None, known: set[str]) -> list[str]:
    package = package_path(module, path) if module else ""
    return [f"{path.name}: {hit}" for hit in private_uses(path.read_text(encoding="utf-8"),
                                                          module, known, package=package)]


def test_no_private_name_is_reached_across_packages_or_from_tests() -> None:
    known = set(modules())
    found = [hit for name, path in modules().items()
             for hit in private_uses_of(path, name, known)]
    tests = Path(__file__).parent
    found += [hit for path in sorted(tests.rglob("*.py"))
              for hit in private_uses_of(path, None, known)]
    assert found == []


# Each way a private name of another package can be reached: (the module it is written in,
# None for a test; the source).
PRIVATE_ESCAPES = [
    ("userturn.labels.stages", "from userturn.store.database import _generation_row\n"),
    ("userturn.labels.stages", "from ..store.database import _generation_row\n"),
    ("userturn.labels.stages", "def f():\n    from ..store import database\n"
                               "    return database._generation_row\n"),
    ("userturn.api", "from . import records\nrecords._private\n"),
    ("userturn.labels.stages", "import userturn.store.database as d\nd._thing\n"),
    ("userturn.labels.stages", "import userturn.store.database\nuserturn.store.database._thing\n"),
    ("userturn.labels.stages", "from userturn.store import database\n"
                               "database.RunStore._migrate\n"),
    ("userturn.labels.stages", "from userturn.store.database import RunStore\n"
                               "RunStore._migrate\n"),
    ("userturn.labels.stages", "import userturn.store.database as d\ngetattr(d, '_thing')\n"),
    (None, "from userturn.store import atomic\n"
           "def test(monkeypatch):\n    monkeypatch.setattr(atomic, '_fsync', None)\n"),
    (None, "def test(monkeypatch):\n"
           "    monkeypatch.setattr('userturn.store.atomic._fsync', None)\n"),
]
# What stays allowed: a package's own private names, dunders, a NamedTuple's API, other
# libraries' private names.
PRIVATE_ALLOWED = [
    ("userturn.store.turns", "from . import database\ndatabase._generation_row\n"),
    ("userturn.store.runstate", "from .database import _generation_row\n"),
    ("userturn.cli.main", "import userturn\nuserturn.__version__\n"),
    ("userturn.labels.stages", "from userturn.records import Turn\nTurn._fields\n"),
    (None, "import argparse\nargparse._SubParsersAction\n"),
]


@pytest.mark.parametrize("module, source", PRIVATE_ESCAPES)
def test_the_private_name_check_finds_each_way_of_reaching_one(module: str | None,
                                                               source: str) -> None:
    assert len(private_uses(source, module, set(modules()))) == 1, source


@pytest.mark.parametrize("module, source", PRIVATE_ALLOWED)
def test_the_private_name_check_lets_a_package_use_its_own(module: str | None,
                                                           source: str) -> None:
    assert private_uses(source, module, set(modules())) == []


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
    found = [f"{name}:{hit}" for name, path in modules().items()
             for hit in stored_config_reads(path.read_text(encoding="utf-8"))]
    assert found == []


# Each way of reading a stored experiment by key.
KEY_READS = [
    "meta.config['models']",
    "meta.config.get('models')",
    "store.meta().config['models']",
    "store.meta().config.get('models', [])",
    "view.meta.config['models']",
    "run_meta.config['models']",
    "'models' in store.meta().config",
    "def f(store):\n    config = store.meta().config\n    return config['models']\n",
    "def f(store):\n    stored = store.meta().config\n    return stored.get('models')\n",
]
# What stays allowed: the config handed whole to a spec's reader, other dicts read by key.
KEY_READS_ALLOWED = [
    "ProbePlan.stored(store.meta().config)",
    "def f(store):\n    config = store.meta().config\n    return Experiment.stored(config)\n",
    "def f(config):\n    return config['models']\n",
    "meta.rows(['config'])",
]


@pytest.mark.parametrize("source", KEY_READS)
def test_the_key_read_check_finds_each_way_of_reading_a_stored_config(source: str) -> None:
    assert len(stored_config_reads(source)) == 1, source


@pytest.mark.parametrize("source", KEY_READS_ALLOWED)
def test_the_key_read_check_lets_the_config_go_to_a_spec_whole(source: str) -> None:
    assert stored_config_reads(source) == []


def stored_config_reads(source: str) -> list[str]:
    """Where ``source`` reads a run's stored experiment by key: ``[...]``, ``.get(...)`` or
    ``in`` on ``meta.config`` however the metadata is reached (``meta``, ``x.meta``,
    ``store.meta()``, ``run_meta``), or on a name a function bound to it
    (``config = store.meta().config``)."""
    tree = ast.parse(source)
    found: set[int] = set()
    for node in ast.walk(tree):
        if _reads_by_key(node, _stored_config):
            found.add(node.lineno)
    for scope in ast.walk(tree):
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        aliases = {target.id for node in ast.walk(scope) if isinstance(node, ast.Assign)
                   and _stored_config(node.value)
                   for target in node.targets if isinstance(target, ast.Name)}

        def alias(node: ast.AST, names: set[str] = aliases) -> bool:
            return isinstance(node, ast.Name) and node.id in names

        found.update(node.lineno for node in ast.walk(scope) if _reads_by_key(node, alias))
    return [f"line {line}" for line in sorted(found)]


def _is_meta(node: ast.AST) -> bool:
    """``meta``, ``x.meta``, ``run_meta``, ``store.meta()``: a run's metadata."""
    if isinstance(node, ast.Call):
        node = node.func
    name = node.id if isinstance(node, ast.Name) else (
        node.attr if isinstance(node, ast.Attribute) else "")
    return name == "meta" or name.endswith("_meta")


def _stored_config(node: ast.AST) -> bool:
    """``<metadata>.config``: a run's stored experiment."""
    return isinstance(node, ast.Attribute) and node.attr == "config" and _is_meta(node.value)


def _reads_by_key(node: ast.AST, config: Callable[[ast.AST], bool]) -> bool:
    """``config[...]``, ``config.get(...)`` or ``... in config``, for what ``config`` accepts."""
    if isinstance(node, ast.Subscript):
        return config(node.value)
    if isinstance(node, ast.Compare):
        return any(isinstance(op, (ast.In, ast.NotIn)) and config(right)
                   for op, right in zip(node.ops, node.comparators))
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get" and config(node.func.value))


def sqlite_imports(source: str) -> list[str]:
    """Where ``source`` imports sqlite3, at the top or inside a function."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                 else [])
        if any(name.split(".")[0] == "sqlite3" for name in names):
            found.append(f"line {node.lineno}")
    return found


def test_no_module_outside_the_store_imports_sqlite() -> None:
    """SQL belongs to ``store/``: every other module calls ``RunStore``, and the store raises its
    faults as ``StoreError`` (a damaged database a ``DamagedStore``), never a SQLite error."""
    for source in ("import sqlite3\n", "def f():\n    import sqlite3 as db\n",
                   "from sqlite3 import DatabaseError\n"):
        assert len(sqlite_imports(source)) == 1, source
    found = {name: hits for name, path in modules().items()
             if package_of(name) != "store"
             and (hits := sqlite_imports(path.read_text(encoding="utf-8")))}
    assert found == {}


def test_the_command_line_entry_stays_thin() -> None:
    """``cli/main.py`` holds the parser and the exit policy; the commands' handlers only parse
    and print, and their work lives in the package that owns it."""
    lines = len((PACKAGE / "cli" / "main.py").read_text(encoding="utf-8").splitlines())
    assert lines <= CLI_MAIN_LIMIT, f"cli/main.py: {lines} lines"
