"""The label taxonomy (userturn.taxonomy) is the one place a label is defined: the judge's rubric
is pinned per rubric version, the docs' label table is the table's, a bad row is refused, and a
label added as one row reaches the terminal tables, the HTML report, the CSV tables, the follow-up
rate, the judge's rubric and the annotation page with nothing else changed."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import fake_probe_run, read_exact

import userturn.taxonomy
from userturn.labels.judge import RUBRIC_VERSION, rubric
from userturn.labels.local_judge import LABEL_RUBRIC_VERSION, label_rubric
from userturn.records import LABELS, Label, is_follow_up
from userturn.store.database import RunStore
from userturn.store.rows import LabelRow
from userturn.store.turns import read_turns
from userturn.taxonomy import TAXONOMY, Taxonomy

ROOT = Path(__file__).parent.parent
GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize(("version", "text"), [(RUBRIC_VERSION, rubric),
                                               (LABEL_RUBRIC_VERSION, label_rubric)])
def test_the_judges_rubric_text_is_its_versions(version, text):
    """Stored verdicts are keyed on the rubric version: the text a version names never changes
    (a new label, a reworded definition or example is a new rubric version)."""
    golden = GOLDEN / f"rubric_{version}.txt"
    assert golden.exists(), f"rubric {version} is new: write its text to {golden.name}"
    assert text() == read_exact(golden), (
        f"the rubric's text changed under version {version}: bump RUBRIC_VERSION in "
        "labels/judge.py (stored verdicts are keyed on it) and write the new text to "
        f"tests/golden/rubric_<version>.txt")


def test_the_docs_label_table_is_the_taxonomy():
    """docs/labels.md's table and the README's list name the labels, in order, with the
    taxonomy's wording; the failure shows the rows the docs should hold."""
    expected = [f"| `{k.name}` | {k.meaning} | {k.examples} |" for k in TAXONOMY.kinds]
    docs = read_exact(ROOT / "docs" / "labels.md").splitlines()
    rows = [line for line in docs if re.match(r"\| `\w+` \|", line)]
    assert rows == expected, "docs/labels.md's label table should read:\n" + "\n".join(expected)
    readme = " ".join(read_exact(ROOT / "README.md").split())
    listed = re.search(r"\(docs/labels\.md\): (.*?)\. The headline", readme)
    assert listed and re.findall(r"`(\w+)`", listed.group(1)) == list(LABELS)


def test_follow_up_is_the_taxonomys_column():
    assert [name for name in LABELS if is_follow_up(name)] == ["follow_up"]
    assert not is_follow_up(None) and not is_follow_up("undecided")


@pytest.mark.parametrize(("change", "problem"), [
    (lambda kinds: (*kinds, kinds[1]), "name 'generic' is given to more than one label"),
    (lambda kinds: (replace(kinds[0], name="undecided"), *kinds[1:]),
     "label name 'undecided': a snake_case word other than undecided, failed, no user turn, "
     "error"),
    (lambda kinds: (replace(kinds[0], name="Follow up"), *kinds[1:]), "label name 'Follow up'"),
    (lambda kinds: (*kinds[:2], replace(kinds[2], header="generic"), *kinds[3:]),
     "header 'generic' is given to more than one label"),
    (lambda kinds: (replace(kinds[0], colour="blue"), *kinds[1:]), "colour 'blue' is not #rrggbb"),
    (lambda kinds: (replace(kinds[0], follow_up=False), *kinds[1:]),
     "no label counts as a follow-up"),
    (lambda kinds: (replace(kinds[0], penalty="drift"), *kinds[1:]),
     "follow_up: a follow-up cannot also pay a penalty"),
    (lambda kinds: (replace(kinds[0], guide=" "), *kinds[1:]), "follow_up: guide is empty"),
    (lambda kinds: (*kinds, *(replace(kinds[-1], name=f"x{i}", header=f"x{i}",
                                      colour=f"#00000{i}") for i in range(3))),
     "10 labels; between 1 and 9 (one annotation key each)"),
    (lambda kinds: (), "0 labels"),
])
def test_a_bad_row_is_refused_in_one_line(change, problem):
    with pytest.raises(ValueError) as raised:
        Taxonomy(change(TAXONOMY.kinds))
    message = str(raised.value)
    assert message.startswith("label taxonomy: ") and problem in message and "\n" not in message


# -- a label added as one row ------------------------------------------------------------------
# The temporary module: the shipped taxonomy with one more row, put in place of userturn.taxonomy
# before anything of userturn is imported, so every module derives from the extended table.
ADD_A_LABEL = r'''
import importlib.util, json, sys, types, urllib.request
taxonomy_file, run, out = sys.argv[1:]
spec = importlib.util.spec_from_file_location("shipped_taxonomy", taxonomy_file)
shipped = importlib.util.module_from_spec(spec)
sys.modules["shipped_taxonomy"] = shipped
spec.loader.exec_module(shipped)
extended = types.ModuleType("userturn.taxonomy")
vars(extended).update({k: v for k, v in vars(shipped).items() if not k.startswith("__")})
extended.TAXONOMY = shipped.Taxonomy((*shipped.TAXONOMY.kinds, shipped.LabelKind(
    name="clarify", meaning="Asks what a word or symbol of the answer means.",
    examples='"What does x stand for?"', rubric="asks what a word or symbol of the answer means.",
    guide="Asks what a word or symbol in the answer means.",
    example=shipped.WorkedExample("What is 2 + x if x = 3?", "2 + x = 5.", "What is x?",
                                  "Asks what a symbol of the answer stands for."),
    header="clarify", colour="#117733", follow_up=True)))
sys.modules["userturn.taxonomy"] = extended

from userturn.cli.main import main
from userturn.labels.annotate import AnnotationServer
from userturn.labels.judge import VERDICT_SCHEMA, rubric

code = main(["report", run, "--html"])
with AnnotationServer(run, "alice") as server:
    page = urllib.request.build_opener(urllib.request.ProxyHandler({})).open(server.url).read().decode()
    keys = [label["key"] for label in server.config()["labels"]]
with open(out, "w") as handle:
    json.dump({"code": code, "rubric": rubric(), "enum": VERDICT_SCHEMA["properties"]["label"]["enum"],
               "keys": keys, "page": page}, handle)
'''


@pytest.fixture()
def clarified_run(tmp_path: Path) -> Path:
    """A run whose turns a judge labelled: every third ``clarify`` (a label the shipped taxonomy
    does not have), the rest ``generic``; the judge decides the run's labels."""
    folder = fake_probe_run(tmp_path).folder
    with closing(RunStore.open(folder)) as store:
        turns = [t for t in read_turns(store) if t.error is None]
        store.put_labels([LabelRow(t.key, "v1", Label("clarify" if i % 3 == 0 else "generic",
                                                      source="judge:fake", rationale="scripted"))
                          for i, t in enumerate(turns)])
        store.update_meta(label_sources=["judge:fake"])
    return folder


def test_a_label_added_as_one_row_reaches_every_table_page_and_rate(clarified_run, tmp_path):
    out = tmp_path / "seen.json"
    # The child imports the userturn this test imports (the checkout's src/ first).
    source = str(Path(userturn.taxonomy.__file__).parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([source, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", ADD_A_LABEL, userturn.taxonomy.__file__,
                           str(clarified_run), str(out)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(out.read_text(encoding="utf-8"))
    assert seen["code"] == 0
    with closing(RunStore.read(clarified_run)) as store:
        turns = [t for t in read_turns(store) if t.error is None]
    clarify = sum(t.label == "clarify" for t in turns)
    assert 0 < clarify < len(turns)

    # The terminal: the label table has a clarify column, after the shipped labels.
    terminal = done.stdout
    header = next(line for line in terminal.splitlines() if "follow-up" in line and "drift" in line)
    assert re.search(r"empty\s*┃\s*clarify\s*┃\s*undecided", header), header
    # The CSV: the summary's label columns and the label-distribution table.
    tables = clarified_run / "report_tables"
    with (tables / "summary.csv").open(encoding="utf-8", newline="") as handle:
        summary = list(csv.DictReader(handle))
    assert sum(int(row["label_clarify"]) for row in summary) == clarify
    # clarify counts as a follow-up: the follow-up rate is its share.
    follow = sum(float(row["follow_up"]) * int(row["follow_up_n"]) for row in summary)
    assert round(follow) == clarify
    with (tables / "labels.csv").open(encoding="utf-8", newline="") as handle:
        assert "clarify" in {row["label"] for row in csv.DictReader(handle)}
    # The HTML report: the label's colour in the plot and the browser's categories.
    html = (clarified_run / "report.html").read_text(encoding="utf-8")
    assert 'fill="#117733"' in html and '"clarify": "#117733"' in html
    # The judge's rubric and schema, and the annotation page's eighth key.
    assert "exactly one of eight labels" in seen["rubric"]
    assert "- clarify: asks what a word or symbol of the answer means." in seen["rubric"]
    assert '"label": "clarify", "rationale": "Asks what a symbol' in seen["rubric"]
    assert seen["enum"] == [*LABELS, "clarify"]
    assert seen["keys"] == list("12345678")
    assert "Keys 1–8 label" in seen["page"] and '"12345678".indexOf' in seen["page"]
