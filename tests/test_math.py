"""MATH-500: answer extraction, normalization, equivalence, the scorer and the loaders."""

from __future__ import annotations

import json
import sys
import time
import types

import pytest

from userturn.data.latex import latex_to_sympy
from userturn.data.math import MathScorer, file_items, hub_items, looks_like_math
from userturn.data.math_answers import (
    as_fraction,
    equivalence,
    extract_answer,
    extract_boxed,
    is_equivalent,
    normalize_answer,
)
from userturn.errors import DatasetError
from userturn.records import Item

# (model response, what extraction must return)
EXTRACTIONS = [
    ("So $x = 3$ and the answer is $\\boxed{3}$.", "3"),
    ("First \\boxed{2}, but correcting myself: \\boxed{5}", "5"),
    ("\\[\\boxed{\\frac{\\sqrt{3}}{2}}\\]", "\\frac{\\sqrt{3}}{2}"),
    ("$\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("\\boxed{\\{1,2\\}} is the set", "\\{1,2\\}"),
    ("\\fbox{7}", "7"),
    ("so we get \\boxed 9 in total", "9"),
    ("cut off: \\boxed{\\frac{1}{2}", None),
    ("Final Answer: The final answer is $\\frac{14}{3}$. I hope it is correct.", "\\frac{14}{3}"),
    ("**Final Answer:** 42", "42"),
    ("Therefore, the answer is 3.5.", "3.5"),
    ("The answer is: \\(2\\sqrt{2}\\)", "2\\sqrt{2}"),
    ("No idea, sorry.", None),
    ("", None),
]


@pytest.mark.parametrize(("response", "expected"), EXTRACTIONS)
def test_extract_answer(response: str, expected: str | None) -> None:
    assert extract_answer(response) == expected


def test_extract_boxed_prefers_the_last_complete_box() -> None:
    assert extract_boxed("\\boxed{1} then \\boxed{\\frac{2}{3}} then \\boxed{4") == "\\frac{2}{3}"
    assert extract_boxed("no box here") is None


@pytest.mark.parametrize(
    ("answer", "normalized"),
    [
        ("\\dfrac{3}{4}", "\\frac{3}{4}"),
        ("\\tfrac12", "\\frac{1}{2}"),
        ("\\frac1{10}", "\\frac{1}{10}"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
        ("90^\\circ", "90"),
        ("90^{\\circ}", "90"),
        ("45°", "45"),
        ("\\$32,\\!348", "32348"),
        ("1,000,000", "1000000"),
        ("10\\text{ inches}", "10"),
        ("12 square units", "12"),
        ("\\text{Evelyn}", "Evelyn"),
        ("\\text{(C)}", "C"),
        ("x = 5", "5"),
        ("x \\in [2, 5)", "[2,5)"),
        ("11\\sqrt2", "11\\sqrt{2}"),
        ("25\\%", "25"),
        (".5", "0.5"),
        ("17.", "17"),
        ("$\\boxed{6 - 5i}$", "6-5i"),
        ("2, -3", "2,-3"),
        ("x^2+y^2=1", "x^2+y^2=1"),
    ],
)
def test_normalize_answer(answer: str, normalized: str) -> None:
    assert normalize_answer(answer) == normalized


# (candidate, reference, how they must be found equal; None: they must differ)
EQUIVALENCES = [
    ("\\frac{1}{2}", "0.5", "numeric"),
    ("0.5", "\\frac12", "numeric"),
    ("1/2", "\\dfrac{1}{2}", "numeric"),
    ("-\\frac{1}{2}", "\\frac{-1}{2}", "numeric"),
    ("1.50", "\\frac{3}{2}", "numeric"),
    ("1,000", "1000", "exact"),
    ("\\dfrac{3}{4}", "\\frac{3}{4}", "exact"),
    ("90^\\circ", "90", "exact"),
    ("\\text{(C)}", "C", "exact"),
    ("\\$32,\\!348", "32348", "exact"),
    ("(3,\\tfrac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)", "exact"),
    ("[-2, 7]", "[-2,7]", "exact"),
    ("(-\\infty, \\frac{1}{2}]", "(-\\infty,0.5]", "elementwise"),
    ("(-2,7]", "[-2,7]", None),  # intervals: the brackets matter
    ("(1,2)", "(2,1)", None),  # ordered pairs: the order matters
    ("2, -3", "-3, 2", "elementwise"),  # "all solutions": any order
    ("\\{1,2\\}", "\\{2,1\\}", "elementwise"),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}", "sympy"),
    ("2\\sqrt{2}", "\\sqrt{8}", "sympy"),
    ("\\sqrt[3]{8}", "2", "sympy"),
    ("\\pi/2", "\\frac{\\pi}{2}", "sympy"),
    ("-5i+6", "6-5i", "sympy"),
    ("x^2+2x+1", "(x+1)^2", "sympy"),
    ("10^{10}", "10000000000", "sympy"),
    ("3", "4", None),
    ("0.333", "\\frac{1}{3}", None),  # rounded decimals are not accepted
    ("2\\sqrt{3}", "3\\sqrt{2}", None),
    ("x+1", "x-1", None),
    ("", "5", None),
]


@pytest.mark.parametrize(("candidate", "reference", "method"), EQUIVALENCES)
def test_equivalence(candidate: str, reference: str, method: str | None) -> None:
    assert equivalence(candidate, reference) == method
    assert is_equivalent(candidate, reference) is (method is not None)


def test_as_fraction() -> None:
    assert as_fraction("\\frac{3}{4}") == as_fraction("0.75") == as_fraction("3/4")
    assert as_fraction("-2") == -2
    assert as_fraction("\\frac{1}{0}") is None
    assert as_fraction("x") is None


def test_sympy_input_is_guarded() -> None:
    started = time.perf_counter()
    assert latex_to_sympy("9^{9^{9}}") is None  # a power tower is never evaluated
    assert latex_to_sympy("2^{100000}") is None
    assert latex_to_sympy("\\frac{1}{2}" * 20) is None  # too long
    assert latex_to_sympy("\\unknown{3}") is None
    assert latex_to_sympy("__import__('os')") is None
    assert latex_to_sympy("\\frac{\\sqrt{3}}{2}") is not None
    assert not is_equivalent("9^{9^{9}}", "9")
    assert not is_equivalent("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "(1,2)")
    assert time.perf_counter() - started < 5


def _item(reference: str) -> Item:
    return Item("m-0000", ({"role": "user", "content": "Compute it."},), reference)


def test_math_scorer() -> None:
    scorer = MathScorer()
    assert scorer.name == "math"
    right = scorer.score(_item("\\frac{1}{2}"), "Dividing, we get $\\boxed{0.5}$.")
    assert (right.correct, right.extracted, right.reference) == (True, "0.5", "\\frac{1}{2}")
    assert right.details == {
        "method": "numeric", "normalized": "0.5", "reference_normalized": "\\frac{1}{2}",
    }
    wrong = scorer.score(_item("\\frac{1}{2}"), "The answer is 2.")
    assert (wrong.correct, wrong.extracted, wrong.details["method"]) == (False, "2", None)
    nothing = scorer.score(_item("5"), "I could not solve it.")
    assert (nothing.correct, nothing.extracted) == (False, None)
    assert nothing.details["normalized"] is None
    json.dumps(dict(right.details))  # the run store keeps details as JSON


ROWS = [
    {"problem": "What is $1+1$?", "answer": "2", "solution": "$1+1=\\boxed{2}$.",
     "unique_id": "test/algebra/1.json", "subject": "Algebra", "level": 1},
    {"problem": "Half of 1?", "answer": "\\frac{1}{2}"},
    {"problem": "Solve $x+1=4$.", "solution": "So $x=\\boxed{3}$."},  # answer from the solution
    {"id": "mine-7", "problem": "What is 6*7?", "answer": 42},
]


def _write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def test_local_jsonl_loads(tmp_path) -> None:
    path = tmp_path / "mini_math.jsonl"
    _write_jsonl(path, ROWS)
    items = file_items(path)
    assert [i.id for i in items] == ["mini_math-0000", "mini_math-0001", "mini_math-0002", "mine-7"]
    assert [i.reference for i in items] == ["2", "\\frac{1}{2}", "3", "42"]
    assert items[0].messages == ({"role": "user", "content": "What is $1+1$?"},)
    assert items[0].metadata == {
        "line": 1, "solution": ROWS[0]["solution"], "unique_id": "test/algebra/1.json",
        "subject": "Algebra", "level": 1,
    }
    assert [i.id for i in file_items(path, limit=2)] == ["mini_math-0000", "mini_math-0001"]
    assert file_items(path, prefix="math500")[0].id == "math500-0000"
    scorer = MathScorer()
    assert all(scorer.score(i, f"\\boxed{{{i.reference}}}").correct for i in items)
    assert looks_like_math(ROWS[0]) and not looks_like_math({"question": "Q", "answer": "1"})


def test_local_json_list_loads(tmp_path) -> None:
    path = tmp_path / "listed.json"
    path.write_text(json.dumps(ROWS), encoding="utf-8")
    assert [i.reference for i in file_items(path)] == ["2", "\\frac{1}{2}", "3", "42"]


@pytest.mark.parametrize(
    ("rows", "where", "field"),
    [
        ([ROWS[1], {"answer": "3"}], "line 2", "problem"),
        ([ROWS[1], ROWS[1], {"problem": " ", "answer": "3"}], "line 3", "problem"),
        ([{"problem": "P?"}], "line 1", "answer"),
        ([{"problem": "P?", "solution": "no box"}], "line 1", "answer"),
        ([{"problem": "P?", "answer": ["1"]}], "line 1", "answer"),
        ([{"problem": "P?", "answer": "  "}], "line 1", "answer"),
        ([{"problem": "P?", "answer": "1", "solution": 5}], "line 1", "solution"),
    ],
)
def test_malformed_rows_name_file_row_and_field(tmp_path, rows, where, field) -> None:
    path = tmp_path / "bad.jsonl"
    _write_jsonl(path, rows)
    with pytest.raises(DatasetError) as caught:
        file_items(path)
    message = str(caught.value)
    assert str(path) in message and where in message and f"'{field}'" in message


def test_file_errors(tmp_path) -> None:
    with pytest.raises(DatasetError, match="not found"):
        file_items(tmp_path / "nowhere.jsonl")
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(ROWS[0]) + '\n{"problem": "oops\n', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"broken\.jsonl line 2: invalid JSON"):
        file_items(broken)
    dupes = tmp_path / "dupes.jsonl"
    _write_jsonl(dupes, [{**ROWS[1], "id": "a"}, {**ROWS[1], "id": "a"}])
    with pytest.raises(DatasetError, match="line 2: duplicate id 'a'"):
        file_items(dupes)
    csv = tmp_path / "table.csv"
    csv.write_text("problem,answer\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"must be a \.jsonl, \.ndjson or \.json file"):
        file_items(csv)


def _fake_datasets(monkeypatch, load) -> None:
    module = types.ModuleType("datasets")
    module.load_dataset = load
    monkeypatch.setitem(sys.modules, "datasets", module)


def test_hub_rows_become_items(monkeypatch) -> None:
    calls = []

    def load(name, split):
        calls.append((name, split))
        return [{"problem": f"P{n}?", "answer": str(n), "solution": f"\\boxed{{{n}}}",
                 "subject": "Algebra", "level": 2, "unique_id": f"test/algebra/{n}.json"}
                for n in range(10)]

    _fake_datasets(monkeypatch, load)
    items = hub_items(limit=3)
    assert calls == [("HuggingFaceH4/MATH-500", "test")]
    assert [i.id for i in items] == ["math500-0000", "math500-0001", "math500-0002"]
    assert items[2].metadata["unique_id"] == "test/algebra/2.json"


def test_hub_failure_is_one_clear_error(monkeypatch) -> None:
    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'HuggingFaceH4/MATH-500' on the Hub\nmore")

    _fake_datasets(monkeypatch, unreachable)
    with pytest.raises(DatasetError, match=r"cannot load HuggingFaceH4/MATH-500 .*local") as caught:
        hub_items()
    assert "\n" not in str(caught.value)
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(DatasetError, match="'datasets' package"):
        hub_items()
