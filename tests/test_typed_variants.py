"""The user-turn and thinking variants are typed fields beside the model, not suffixes of its name.

A run stores the model's spec and, in columns of their own, the user turn's opening
(``user_variant``) and the template's ``enable_thinking``; the tables print the name runs before
the typed fields stored (``MODEL[thinking=on][user=SPEC]``), and the generation keys are those
the suffixed names gave, so a folder of any release resumes with no model call.

``fixtures/runs/variants-before-typed`` was written by ``userturn run`` before the typed fields
(the scripted Qwen3 of ``test_reasoning_pipeline``, ``enable_thinking`` on and off, the
``prefill:So`` user-turn variant, three questions, greedy); ``variants-before-typed.report.txt``
is what ``userturn report`` printed for it then (both made under this suite's conftest, whose
form-only classifier labelled the turns). The digests below are the keys that release gave the
suffixed names.
"""

from __future__ import annotations

import csv
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from conftest import QUESTIONS
from helpers import THINKING_ITEMS, load_family, thinking_experiment

from userturn import load_run
from userturn.backends.fake import ScriptedBackend
from userturn.cli.main import main
from userturn.config import Experiment
from userturn.probe.pipeline import run_experiment
from userturn.records import GenerationParams, Request, Turn, probed_name
from userturn.stats.variants import variant_comparisons
from userturn.store.database import RunStore
from userturn.store.sqlite import generation_key
from userturn.store.turns import read_turns

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
OLD = "variants-before-typed"
REFERENCE = {q: a for q, a in QUESTIONS}
PROBED = [("fake/qwen3", "native", "off"), ("fake/qwen3", "prefill:So", "off"),
          ("fake/qwen3", "native", "on"), ("fake/qwen3", "prefill:So", "on")]


def question(prompt: str) -> str:
    return next(q for q in REFERENCE if q in prompt)


def qwen3_script(request: Request) -> str:
    """The scripted Qwen3 the fixture was written with (test_reasoning_pipeline's): answers
    with thinking where the template leaves the block open; in the user's seat, thinking then
    thanks, thinking cut short, or a follow-up."""
    prompt = request.prompt
    if prompt.endswith("<|im_start|>user\n"):
        asked = question(prompt.rsplit("<|im_start|>assistant", 1)[0])
        if asked == QUESTIONS[0][0]:
            return "<think>\nThe user is asking something.\n</think>\n\nThanks!"
        if asked == QUESTIONS[1][0]:
            return ("<think>\nThe user wants me to write what they would say next, so let me "
                    "consider the numbers in the answer and what a curious student might ask "
                    "about them")
        return "Why did you multiply 20 by 6?"
    answer = f"The answer is {REFERENCE[question(prompt)]}."
    if prompt.endswith("</think>\n\n"):  # enable_thinking false: the template closed the block
        return answer
    return f"<think>\nMaybe it is #### 99\n</think>\n\n{answer}"


def qwen3_backend() -> ScriptedBackend:
    template = load_family("qwen3")
    template = template.__class__(template.source, "fake/qwen3", None, "<|im_end|>")
    return ScriptedBackend(qwen3_script, spec="fake/qwen3", template=template)


def variants_experiment(gsm_file: Path, out: Path) -> Experiment:
    return thinking_experiment(gsm_file, out, enable_thinking=[True, False],
                               user_turn_variants=["prefill:So"])


def tables(capsys, folder: Path) -> str:
    """What `userturn report` prints, less the stage times (a re-run adds its own)."""
    assert main(["report", str(folder)]) == 0
    return "".join(line for line in capsys.readouterr().out.splitlines(keepends=True)
                   if not line.startswith("time by stage"))


def plan_columns(folder: Path) -> set[tuple[str, str | None, str | None]]:
    """The plan table's model and variant columns, read raw."""
    with closing(sqlite3.connect(folder / "userturn.db")) as db:
        return set(db.execute("SELECT DISTINCT model, user_variant, enable_thinking FROM plan "
                              "WHERE model != 'human'"))


# ------------------------------------------------------------------ keys


REQUEST = Request("<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n4."
                  "<|im_end|>\n<|im_start|>user\n", GenerationParams(0.7, 1.0, 64),
                  ("<|im_end|>",), 12345)


@pytest.mark.parametrize("user_variant, enable_thinking, suffixed, before", [
    ("native", "default", "tiny",
     "e18582cee28c385cbb51671b18cccab02aabb122af69ce8adc9e8d03f85f6f22"),
    ("prefill:So", "default", "tiny[user=prefill:So]",
     "a126f872147af7f5d2a1177c1334ca5081e83e3c8ccf335fd214056e8c178950"),
    ("native", "on", "tiny[thinking=on]",
     "8c3784917e4458efdd0aa5096de5eaee816bb3de7d3706ee22ffb52fde7c911f"),
    ("native", "off", "tiny[thinking=off]",
     "67fb03859fc534354dd7926bab024db36ec402e276d63fac398981ea6eb112b2"),
    ("prefill:So", "on", "tiny[thinking=on][user=prefill:So]",
     "35fe63a9cc0e697232afeb840150d91f9ac5622aaa54e029f22a37e3564e53b4"),
])
def test_the_typed_fields_give_the_key_the_suffixed_name_gave(user_variant, enable_thinking,
                                                               suffixed, before):
    typed = generation_key("user", "tiny", "main", "abc123", REQUEST, 2,
                           user_variant=user_variant, enable_thinking=enable_thinking)
    assert typed == before  # the release before the typed fields, from the suffixed name
    assert generation_key("user", suffixed, "main", "abc123", REQUEST, 2) == before
    assert probed_name("tiny", user_variant, enable_thinking) == suffixed


def test_the_continuation_arm_of_a_thinking_variant_keeps_its_key():
    assert generation_key("user", "tiny", "main", "abc123", REQUEST, 2, arm="continuation",
                          enable_thinking="off") == \
        "d3a79fc93c9173b65db9609d35a9ff5440e493315b1c2943c79a44b47cd7d675"


# ------------------------------------------------------------------ a folder written before


@pytest.fixture
def old_run(tmp_path: Path) -> Path:
    folder = tmp_path / OLD
    shutil.copytree(FIXTURES / OLD, folder)
    return folder


def test_a_folder_with_suffixed_names_reads_as_typed_fields_read_only_too(old_run, capsys):
    expected = (FIXTURES / f"{OLD}.report.txt").read_text(encoding="utf-8")
    with closing(sqlite3.connect(old_run / "userturn.db")) as db:  # the names, suffixed
        assert {r[0] for r in db.execute("SELECT DISTINCT model FROM plan")} - {"human"} == {
            probed_name(*p) for p in PROBED}
    with closing(RunStore(old_run, read_only=True)) as store:
        turns = read_turns(store)
    assert {(t.model, t.user_variant, t.enable_thinking) for t in turns} == set(PROBED)
    assert {t.probed for t in turns} == {
        "fake/qwen3[thinking=off]", "fake/qwen3[thinking=off][user=prefill:So]",
        "fake/qwen3[thinking=on]", "fake/qwen3[thinking=on][user=prefill:So]"}
    answers = load_run(old_run).answers()
    assert {(a.model, a.enable_thinking) for a in answers} == {("fake/qwen3", "on"),
                                                               ("fake/qwen3", "off")}
    assert tables(capsys, old_run) == expected


def test_a_folder_with_suffixed_names_resumes_with_no_model_call(old_run, gsm_file, capsys):
    before = tables(capsys, old_run)
    backend = qwen3_backend()
    store = run_experiment(variants_experiment(gsm_file, old_run),
                           backends={"fake/qwen3": backend})
    store.close()
    assert backend.calls == 0  # every key the typed fields make is one the folder holds
    assert tables(capsys, old_run) == before
    # The re-run planned its rows with the typed columns; none under a suffixed name is left.
    assert plan_columns(old_run) == set(PROBED)


# ------------------------------------------------------------------ a new run


def test_a_new_run_stores_the_model_and_typed_variants_and_prints_what_runs_printed(
        gsm_file, tmp_path, capsys):
    out = tmp_path / "run"
    store = run_experiment(variants_experiment(gsm_file, out), backends={"fake/qwen3":
                                                                         qwen3_backend()})
    store.close()
    assert plan_columns(out) == set(PROBED)
    with closing(sqlite3.connect(out / "userturn.db")) as db:  # no suffixed name stored
        assert {r[0] for r in db.execute("SELECT DISTINCT model FROM generations")} == {
            "fake/qwen3"}
    assert tables(capsys, out) == (FIXTURES / f"{OLD}.report.txt").read_text(encoding="utf-8")

    # summary.csv and the flat export carry the model's spec and the two typed columns.
    assert main(["report", str(out), "--html"]) == 0
    capsys.readouterr()
    summary = list(csv.DictReader((out / "report_tables" / "summary.csv").open(encoding="utf-8")))
    assert list(summary[0])[:4] == ["model", "arm", "user_variant", "enable_thinking"]
    assert [(r["model"], r["user_variant"], r["enable_thinking"]) for r in summary] == PROBED
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "fake/qwen3[thinking=on][user=prefill:So]" in page  # the page prints the name
    turns = load_run(out).turns()
    assert {(t.model, t.user_variant, t.enable_thinking) for t in turns} == set(PROBED)
    assert all("[" not in t.model for t in turns)
    assert main(["export", str(out), "--format", "csv", "--out", str(tmp_path / "t.csv")]) == 0
    flat = list(csv.DictReader((tmp_path / "t.csv").open(encoding="utf-8")))
    assert list(flat[0])[:4] == ["model", "arm", "user_variant", "enable_thinking"]
    assert {(r["model"], r["user_variant"], r["enable_thinking"]) for r in flat} == set(PROBED)


def test_the_hugging_face_export_has_the_typed_columns(gsm_file, tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "run"
    run_experiment(variants_experiment(gsm_file, out),
                   backends={"fake/qwen3": qwen3_backend()}).close()
    assert main(["export", str(out), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    loaded = datasets.load_dataset(str(tmp_path / "hf"))["train"]
    assert loaded.column_names[:4] == ["model", "arm", "user_variant", "enable_thinking"]
    assert set(zip(loaded["model"], loaded["user_variant"], loaded["enable_thinking"])) == set(
        PROBED)
    card = (tmp_path / "hf" / "README.md").read_text(encoding="utf-8")
    assert "| fake/qwen3[thinking=on][user=prefill:So] |" in card  # the card's table prints it


def test_variants_pair_with_native_by_the_typed_field(gsm_file, tmp_path):
    store = run_experiment(variants_experiment(gsm_file, tmp_path / "run"),
                           backends={"fake/qwen3": qwen3_backend()})
    turns = read_turns(store)
    store.close()
    comparisons = variant_comparisons(turns)
    assert [(c.model, c.enable_thinking, c.variant, c.native) for c in comparisons] == [
        ("fake/qwen3", "off", "prefill:So", "fake/qwen3[thinking=off]"),
        ("fake/qwen3", "on", "prefill:So", "fake/qwen3[thinking=on]")]
    for c in comparisons:
        native = [t for t in turns if (t.user_variant, t.enable_thinking) == ("native",
                                                                              c.enable_thinking)]
        assert c.follow_up.items == THINKING_ITEMS
        assert c.follow_up.a.hits == sum(t.follow_up for t in native)


def test_a_model_whose_name_has_brackets_is_not_read_as_a_variant(gsm_file, tmp_path):
    spec = "fake/probe[user=x]"  # a model's own name, such as a local folder's
    backend = ScriptedBackend(lambda r: "Why 26?" if r.prompt.endswith("user\n") else "26.",
                              spec=spec)
    out = tmp_path / "run"
    exp = Experiment(models=[spec], datasets=[str(gsm_file)], limit=2, temperatures=[0.0],
                     user_max_tokens=8, output=out, user_turn_variants=["prefill:So"])
    run_experiment(exp, backends={spec: backend}).close()
    assert plan_columns(out) == {(spec, "native", "default"), (spec, "prefill:So", "default")}
    with closing(RunStore(out, read_only=True)) as store:
        turns = [t for t in read_turns(store) if t.model != "human"]
    assert {(t.model, t.user_variant) for t in turns} == {(spec, "native"), (spec, "prefill:So")}
    comparisons = variant_comparisons(turns)
    assert [(c.model, c.variant, c.native) for c in comparisons] == [(spec, "prefill:So", spec)]


def test_two_turns_that_differ_only_in_the_variant_are_two_conditions():
    base = dict(answerer="self", dataset="d", perturbation="none", temperature=0.0,
                sample_index=0, item_id="1", context="c", key="k", query="q", answer="a",
                answer_correct=None, user_turn="u", raw_user_turn="u", thinking=None,
                finish_reason="stop", error=None, prompt="p", label="follow_up",
                label_source="rules", rationale=None, label_error=None)
    native = Turn(model="m", **base)
    variant = Turn(model="m", **{**base, "key": "k2"}, user_variant="warmup:1")
    assert [(c.variant, c.follow_up.items) for c in variant_comparisons([native, variant])] == [
        ("warmup:1", 1)]
    assert variant_comparisons([variant]) == []  # no native turns: nothing to pair with
