"""A test file imports what it shares from tests/helpers.py (or a fake such as openai_fake),
never from another test file: importing a test file runs its module code and collects its tests
a second time under another name, and moving one test breaks files that only borrowed from it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).parent
# Python source handed to a subprocess is an import too (test_rules runs its table in one).
IMPORT_IN_SOURCE = re.compile(r"^\s*(?:from\s+(test_\w+)\s+import|import\s+(test_\w+))", re.M)


def imported_test_files(path: Path) -> set[str]:
    """The test modules ``path`` imports: at the top, inside a function, or in source it runs."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.update(a or b for a, b in IMPORT_IN_SOURCE.findall(node.value))
    return {name for name in found if name.split(".")[0].startswith("test_")}


def cross_imports(folder: Path) -> dict[str, set[str]]:
    return {path.name: names for path in sorted(folder.glob("*.py"))
            if (names := imported_test_files(path))}


def test_no_test_file_imports_another_test_file():
    found = cross_imports(TESTS)
    found.pop(Path(__file__).name, None)  # its own samples below are strings, not imports
    assert found == {}


def test_the_check_sees_every_kind_of_import(tmp_path):
    (tmp_path / "test_a.py").write_text("from test_b import helper\n")
    (tmp_path / "test_c.py").write_text("def f():\n    import test_d\n")
    (tmp_path / "test_e.py").write_text('CODE = """\nimport sys\nfrom test_f import X\n"""\n')
    (tmp_path / "test_g.py").write_text("from helpers import experiment\nimport json\n")
    assert cross_imports(tmp_path) == {"test_a.py": {"test_b"}, "test_c.py": {"test_d"},
                                       "test_e.py": {"test_f"}}
