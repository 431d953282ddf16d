"""userturn compare: paired differences between two runs on the items they share."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from test_pipeline import ITEMS, SAMPLES, experiment, is_user_turn

from userturn.backends.fake import ScriptedBackend
from userturn.cli.main import main
from userturn.errors import StoreError
from userturn.probe.pipeline import run_experiment
from userturn.records import Request
from userturn.report.compare import compare_runs
from userturn.store.database import RunStore
from userturn.store.turns import read_turns


def answers(request: Request) -> str:
    return "#### 26" if "3 boxes" in request.prompt else "#### 1"


def base(request: Request) -> str:
    return answers(request) if not is_user_turn(request) else "Thanks!"


def trained(request: Request) -> str:
    """Follows up on the answer's number for the first four items, thanks for the rest."""
    if not is_user_turn(request):
        return answers(request)
    early = any(q in request.prompt for q in ("3 boxes", "45 apples", "20 pages", "60 km"))
    return "Why is it 26? I think it should be 27." if early and "26" in request.prompt else (
        "Why is it 1? I think it should be 2." if early else "Thanks!")


def make_run(gsm_file, tmp_path, name, script, spec, **changes):
    exp = experiment(gsm_file, tmp_path / name, models=[spec], **changes)
    return run_experiment(exp, backends={spec: ScriptedBackend(script, spec=spec)})


def test_paired_difference_between_base_and_checkpoint(gsm_file, tmp_path):
    a = make_run(gsm_file, tmp_path, "a", base, "fake/base")
    b = make_run(gsm_file, tmp_path, "b", trained, "fake/tuned")
    comparisons, accuracy = compare_runs(a, b)
    greedy, sampled = comparisons
    assert (greedy.model_a, greedy.model_b) == ("fake/base", "fake/tuned")
    assert greedy.follow_up.items == ITEMS
    assert greedy.follow_up.delta == pytest.approx(4 / ITEMS)
    assert greedy.follow_up.low > 0  # every item moved the same way or not at all
    assert greedy.mcnemar is not None and (greedy.mcnemar.b01, greedy.mcnemar.b10) == (4, 0)
    assert sampled.mcnemar is None  # several samples per item: no McNemar
    assert sampled.follow_up.b.n == ITEMS * SAMPLES
    (acc,) = accuracy
    assert acc.accuracy.delta == 0 and acc.mcnemar.p_value == 1.0


def test_compare_uses_shared_items_only_and_says_so(gsm_file, tmp_path, capsys):
    a = make_run(gsm_file, tmp_path, "a", base, "fake/base")
    b = make_run(gsm_file, tmp_path, "b", trained, "fake/tuned", limit=4)
    comparisons, _ = compare_runs(a, b)
    assert comparisons[0].follow_up.items == 4 and comparisons[0].follow_up.dropped_a == 2
    a.close(), b.close()
    assert main(["compare", str(tmp_path / "a" / "run"), str(tmp_path / "b" / "run")]) == 0
    out = capsys.readouterr().out
    assert "B minus A" in out and "+100.0 pts" in out and "2/0" in out


def test_compare_refuses_runs_whose_items_differ(gsm_file, tmp_path):
    a = make_run(gsm_file, tmp_path, "a", base, "fake/base")
    other = tmp_path / "other.jsonl"
    rows = [json.loads(line) for line in gsm_file.read_text().splitlines()]
    rows[0]["question"] = "A different question entirely?"
    other.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # The same file stem gives the same item ids: a different question behind the same id.
    (tmp_path / "b").mkdir()
    renamed = tmp_path / "b" / gsm_file.name
    renamed.write_text(other.read_text())
    b = make_run(renamed, tmp_path, "b", trained, "fake/tuned")
    with pytest.raises(StoreError, match="disagree on item"):
        compare_runs(a, b)


def test_compare_page_has_the_forest_plot_and_escapes_names(gsm_file, tmp_path, capsys):
    a = make_run(gsm_file, tmp_path, "a", base, "fake/base")
    b = make_run(gsm_file, tmp_path, "b", trained, "fake/tuned")
    a.close(), b.close()
    page = tmp_path / "compare.html"
    assert main(["compare", str(tmp_path / "a" / "run"), str(tmp_path / "b" / "run"),
                 "--html", str(page)]) == 0
    html = page.read_text()
    assert "<svg" in html and "B higher, interval excludes 0" in html
    assert "+66.7 pts" in html
    assert not re.search(r"(src|href)\s*=\s*[\"']?https?:", html)  # self-contained
    from userturn.report.compare import comparison_html

    comparisons, accuracy = compare_runs(RunStore.open(tmp_path / "a" / "run"),
                                         RunStore.open(tmp_path / "b" / "run"))
    assert "&lt;script&gt;" in comparison_html(comparisons, accuracy, ("<script>", "b"))
    # A table cell is escaped too: a model's name is text, never markup.
    odd = [replace(comparisons[0], model_a="<i>base</i>"), *comparisons[1:]]
    page_text = comparison_html(odd, accuracy, ("a", "b"))
    assert '<td class="">&lt;i&gt;base&lt;/i&gt;</td>' in page_text and "<i>" not in page_text


def test_runs_with_a_human_baseline_pair_their_one_probed_model(tmp_path):
    from test_dataset_runs import CONVERSATIONS

    chats = tmp_path / "chats.json"
    chats.write_text(json.dumps(CONVERSATIONS))
    a = make_run(chats, tmp_path, "a", base, "fake/base", datasets=[f"conversations:{chats}"],
                 skip_invalid=True)
    b = make_run(chats, tmp_path, "b", trained, "fake/tuned", datasets=[f"conversations:{chats}"],
                 skip_invalid=True)
    assert "human" in {t.model for t in read_turns(a)}
    comparisons, _ = compare_runs(a, b)
    assert {(c.model_a, c.model_b) for c in comparisons} == {("fake/base", "fake/tuned")}
