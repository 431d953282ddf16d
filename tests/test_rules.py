"""Table-driven tests of the rule-based classifier against realistic generated user turns.

Every expectation follows docs/labels.md. ``None`` means the rules must stay undecided (the
case is ambiguous, or beyond what rules can judge) and leave it to the LLM judge.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter

import pytest
from rule_cases import (
    A_CAPITAL,
    A_CLIPS,
    A_TIMES,
    CASES,
    CHATML,
    Q_CAPITAL,
    Q_CLIPS,
    Q_TIMES,
    SPEC_CASES,
    C,
    as_case,
)

from userturn.labels.rules import RulesClassifier
from userturn.labels.sources import labeller_named
from userturn.records import LABELS, Case


@pytest.fixture(scope="module")
def classifier() -> RulesClassifier:
    return RulesClassifier()


@pytest.mark.parametrize("c", [pytest.param(c, id=c.name) for c in CASES + SPEC_CASES])
def test_label(classifier: RulesClassifier, c: C) -> None:
    label = classifier.classify(as_case(c))
    assert label.label == c.expected, label.rationale
    assert label.source == "rules"
    assert label.rationale.strip()
    assert label.error is None
    assert label.rationale.startswith("undecided") == (c.expected is None)


def test_cases_cover_every_label() -> None:
    assert len({c.name for c in CASES + SPEC_CASES}) == len(CASES + SPEC_CASES)
    counts = Counter(c.expected for c in CASES)
    assert all(counts[name] >= 6 for name in LABELS), counts
    assert counts[None] >= 8 and sum(counts.values()) - counts[None] >= 45


QUERIES = {c.query: c.answer for c in CASES + SPEC_CASES}  # every query of the tables, once


@pytest.mark.parametrize("query", [pytest.param(q, id=q[:40]) for q in QUERIES])
def test_the_query_again_is_restatement(classifier: RulesClassifier, query: str) -> None:
    """labels.md: a turn that repeats the original query is restatement, whatever the query's
    length or voice, with or without its end mark, in any case and spacing."""
    for turn in (query, "  " + query + "\n", query.lower().rstrip("?.!")):
        label = classifier.classify(Case(query, QUERIES[query], turn, turn, CHATML))
        assert label.label == "restatement", (turn, label.rationale)


def test_the_issue_cases_through_the_cascade() -> None:
    """The rules decide the query asked again; "And how many people live there?" they leave to
    the classifier, which gives it a probability (issue #39: new_query, no probability)."""
    cascade = labeller_named("cascade").case_labeller()
    again = cascade.classify(Case(Q_TIMES, A_TIMES, Q_TIMES, Q_TIMES, CHATML))
    assert (again.label, again.source, again.probability) == ("restatement", "rules", None)
    there = "And how many people live there?"
    goes_on = cascade.classify(Case(Q_CAPITAL, A_CAPITAL, there, there, CHATML))
    assert goes_on.source == "classifier" and goes_on.label in LABELS
    assert goes_on.probability is not None and 0 < goes_on.probability <= 1


# How the pipeline ends a user turn: the raw text runs up to and including the first stop marker,
# the template's end-of-turn or its assistant header (the only marker for deepseek, glm4, [INST]).
HEADER_CASES = [
    ("chatml-end-of-turn", "Why 72?<|im_end|>", "<|im_start|>assistant", "follow_up"),
    ("mistral-terminator", "Why 72? [/INST]", "[/INST]", "follow_up"),
    ("glm4-terminator", "Thanks!<|assistant|>", "<|assistant|>", "generic"),
    ("deepseek-terminator", "Thanks! But why 72?<｜Assistant｜>", "<｜Assistant｜>", "follow_up"),
    ("chatml-header-ends-user-text", "Why 72?<|im_start|>assistant", "<|im_start|>assistant",
     "follow_up"),
    ("llama3-header-then-speech",
     "<|start_header_id|>assistant<|end_header_id|>\n\nNatalia sold 72 clips.",
     "<|start_header_id|>assistant<|end_header_id|>", "assistant_drift"),
    ("chatml-header-then-speech", "Hmm.<|im_start|>assistant\nIn May she sold 24 clips, so 72.",
     "<|im_start|>assistant", "assistant_drift"),
    ("header-unknown-to-case", "<|im_start|>assistant\nSure, the total is 72.", "",
     "assistant_drift"),
]


@pytest.mark.parametrize("raw, header, expected",
                         [pytest.param(*h[1:], id=h[0]) for h in HEADER_CASES])
def test_assistant_header(raw: str, header: str, expected: str) -> None:
    visible = raw
    for marker in ("<|im_end|>", "[/INST]", "<|assistant|>", "<｜Assistant｜>", CHATML):
        visible = visible.split(marker)[0]
    label = RulesClassifier().classify(Case(Q_CLIPS, A_CLIPS, visible.strip(), raw, header))
    assert (label.label, label.source) == (expected, "rules"), label.rationale


def test_interface() -> None:
    assert RulesClassifier.name == "rules"
    assert RulesClassifier.version


ODD_TURNS = [
    "word " * 20000,
    "Why did you divide by 2? " * 3000,
    "a" * 50000 + "!",
    "🙂🙃" * 500 + "\u200b\u202e مرحبا بك שלום",
    "e\u0301\u0301\u0301 ñ \x00 \x1b[31m",
    "<|im_start|><|im_end|><|eot_id|></s><s><think></think>[INST][/INST]<<SYS>>",
    "#### " + "9" * 5000,
    "(" * 3000 + ")" * 3000,
    "1 + 1 = 2\n" * 2000,
    " + ".join(str(i) for i in range(20000)),  # took minutes with a backtracking equation regex
    "Why? " + " ".join(f"{i}x{i + 1}" for i in range(10000)),
]


@pytest.mark.parametrize("text", ODD_TURNS, ids=range(len(ODD_TURNS)))
def test_odd_input_never_raises(classifier: RulesClassifier, text: str) -> None:
    case = Case(Q_CLIPS, A_CLIPS, text, text + "<|im_end|>", CHATML)
    started = time.perf_counter()
    label = classifier.classify(case)
    assert time.perf_counter() - started < 5.0
    assert label == RulesClassifier().classify(case)
    assert label.source == "rules" and label.rationale and label.error is None
    assert label.label is None or label.label in LABELS


def test_odd_query_and_answer(classifier: RulesClassifier) -> None:
    for query, answer in [("", ""), ("?", "\x00"), ("💥" * 1000, "<|im_end|>" * 100)]:
        label = classifier.classify(Case(query, answer, "Thanks! But why 72?", "", ""))
        assert label.source == "rules" and label.rationale and label.error is None


_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from rule_cases import CASES, SPEC_CASES, as_case
from userturn.labels.rules import RulesClassifier
print(json.dumps([list(RulesClassifier().classify(as_case(c)).__dict__.values())
                  for c in CASES + SPEC_CASES]))
"""


def test_deterministic_across_processes(classifier: RulesClassifier) -> None:
    """Same labels and rationales under different string-hash seeds (no set-order leaks)."""
    here = os.path.dirname(os.path.abspath(__file__))
    runs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", _SCRIPT, here], env=env, check=True,
                             capture_output=True, text=True).stdout
        runs.append(json.loads(out))
    expected = [list(classifier.classify(as_case(c)).__dict__.values())
                for c in CASES + SPEC_CASES]
    assert runs[0] == runs[1] == expected
