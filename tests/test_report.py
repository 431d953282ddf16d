"""The HTML report and its exported tables: numbers, safety of model text, and the page in a
real browser."""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from helpers import (
    BOLD,
    IMG_TAG,
    REPORT_PERTURBATIONS,
    REPORT_TEMPERATURES,
    SCRIPT_TAG,
    build_report_run,
)

from userturn import load_run
from userturn.records import LABELS, STATUSES, Label
from userturn.report import export_tables, write_html_report
from userturn.report.markup import json_for_script
from userturn.stats.rates import paired_difference
from userturn.store.database import RunStore
from userturn.store.rows import LabelRow
from userturn.store.turns import read_turns

MODELS = ["fake/alpha", "fake/beta"]
JUDGE_XSS = 'judge says <img src=x onerror="window.__pwned=3">'


def add_judge_labels(store: RunStore) -> None:
    """A fake judge labels what the rules left undecided (some verdicts failed), and a human
    labels a few turns; the run then reads rules, then the judge."""
    undecided = [t for t in read_turns(store, "rules") if t.error is None and t.label is None]
    rows = []
    for i, turn in enumerate(undecided):
        if i % 4 == 3:
            label = Label(None, source="judge:fake", error="verdict outside the label set")
        else:
            label = Label(["restatement", "meta", "empty"][i % 3], source="judge:fake",
                          rationale=JUDGE_XSS)
        rows.append(LabelRow(turn.key, "v1", label))
    humans = [LabelRow(t.key, "h", Label("follow_up", source="human:alice",
                                         rationale="<i>agree</i>"))
              for t in read_turns(store)[:5]]
    store.put_labels(rows + humans)
    store.update_meta(label_sources=["rules", "judge:fake"])


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("report")
    store = build_report_run(folder, MODELS)
    add_judge_labels(store)
    store.close()
    return folder / "run"


@pytest.fixture(scope="module")
def report_html(run_folder: Path) -> Path:
    return write_html_report(load_run(run_folder).report(),
                             run_folder.parent / "html" / "report.html",
                             tables_dir=run_folder.parent / "html" / "tables")


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def json_block(html: str) -> str:
    match = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html,
                      re.S)
    assert match
    return match.group(1)


# -- the file ------------------------------------------------------------------------------------
def test_page_is_self_contained(report_html):
    html = report_html.read_text(encoding="utf-8")
    assert not re.search(r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:)?//""", html, re.I)
    assert set(re.findall(r"https?://[^\s\"'<>)]+", html)) <= {"http://www.w3.org/2000/svg"}
    assert "<link" not in html and "@import" not in html and "url(" not in html
    assert "<iframe" not in html.lower() and "<img" not in html.lower()


def test_all_plots_are_inline_svg(report_html):
    html = report_html.read_text(encoding="utf-8")
    assert html.count('<svg class="plot lines"') == 1
    assert html.count('<svg class="plot scatter"') == len(REPORT_TEMPERATURES)
    assert html.count('<svg class="plot bars"') == 1
    assert html.count('<svg class="plot forest"') == 1
    for words in ("Sampling temperature", "Genuine follow-up rate", "Task accuracy",
                  "Share of generated user turns", "Perturbed minus original"):
        assert words in html  # axis titles
    assert "too few for Spearman ρ (needs ≥ 3)" in html  # two models only


def test_model_text_appears_only_escaped(report_html):
    html = report_html.read_text(encoding="utf-8")
    assert html.count("<script") == 2  # the JSON block and the page's own script
    assert "window.__pwned" not in html.replace(json_block(html), "")
    for raw in (SCRIPT_TAG, IMG_TAG, BOLD, "<b>", "onerror=\"window", "</script><img"):
        assert raw not in html
    block = json_block(html)
    assert "<" not in block and ">" not in block and "&" not in block
    assert "\\u003cscript\\u003ewindow.__pwned=1\\u003c/script\\u003e" in block
    data = json.loads(block)  # the escapes are plain JSON: the text survives exactly
    shown = {t["user_turn"] for t in data["turns"]}
    assert {SCRIPT_TAG, IMG_TAG, BOLD} <= shown
    assert any(JUDGE_XSS == label[2] for t in data["turns"] for label in t["labels"])


def test_json_for_script_cannot_close_or_open_comments():
    text = json_for_script({"a": "</script><!--<script>", "b": "\u2028&"})
    assert "</" not in text and "<!--" not in text and "&" not in text
    assert json.loads(text) == {"a": "</script><!--<script>", "b": "\u2028&"}


def test_header_has_config_versions_sources(report_html, run_folder):
    html = report_html.read_text(encoding="utf-8")
    assert str(run_folder.resolve()) in html
    assert "2 models × 1 dataset × T {0, 0.7, 1} × 3 samples" in html
    assert "rules, then judge:fake" in html and "human:alice (5)" in html
    assert "userturn 0.1.0" in html and "Report written" in html


# -- the numbers ---------------------------------------------------------------------------------
def test_tables_are_exported_with_the_summary_numbers(report_html, run_folder):
    tables = run_folder.parent / "html" / "tables"
    store = RunStore.open(run_folder)
    rows, turns = load_run(store).summary(), read_turns(store)
    summary = read_csv(tables / "summary.csv")
    assert len(summary) == len(rows) == len(MODELS) * len(REPORT_TEMPERATURES) * (1 + len(REPORT_PERTURBATIONS))
    for record, row in zip(summary, rows):
        assert (record["model"], record["perturbation"], float(record["temperature"])) == (
            row.model, row.perturbation, row.temperature)
        assert int(record["follow_up_hits"]) == row.follow_up.hits
        assert int(record["follow_up_n"]) == row.follow_up.n
        assert math.isclose(float(record["follow_up_low"]), row.follow_up.low, abs_tol=1e-6)
        assert (int(record["undecided"]), int(record["label_errors"]),
                int(record["errors"])) == (row.undecided, row.label_errors, row.errors)
    assert sum(r.errors for r in rows) > 0 and sum(r.label_errors for r in rows) > 0
    assert len(read_csv(tables / "user_turns.csv")) == len(turns)
    stored = store.db.execute("SELECT COUNT(*) FROM labels").fetchone()[0]
    assert len(read_csv(tables / "turn_labels.csv")) == stored
    # Every label and status per row; `no user turn` only in runs with the continuation arm.
    assert len(read_csv(tables / "labels.csv")) == len(rows) * (len(LABELS) + len(STATUSES) - 1)
    assert len(read_csv(tables / "right_vs_wrong.csv")) == len(MODELS) * len(REPORT_TEMPERATURES)
    assert len(read_csv(tables / "accuracy_vs_follow_up.csv")) == len(MODELS) * len(REPORT_TEMPERATURES)
    assert len(read_csv(tables / "rank_correlation.csv")) == len(REPORT_TEMPERATURES)
    store.close()
    html = report_html.read_text(encoding="utf-8")
    assert 'href="tables/summary.csv"' in html
    if _has_pyarrow():
        assert (tables / "summary.parquet").exists()


def _has_pyarrow() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def test_perturbation_differences_are_paired_over_shared_items(report_html, run_folder):
    records = read_csv(run_folder.parent / "html" / "tables" / "perturbations.csv")
    assert len(records) == len(MODELS) * len(REPORT_PERTURBATIONS) * len(REPORT_TEMPERATURES)
    store = RunStore.open(run_folder)
    sides: dict[tuple, list[tuple[str, bool]]] = defaultdict(list)
    for t in read_turns(store):
        if t.error is None:  # every generated turn counts, a failed verdict's included
            sides[(t.model, t.perturbation, t.temperature)].append(
                (t.item_id, t.label == "follow_up"))
    store.close()
    for record in records:
        key = (record["model"], record["perturbation"], float(record["temperature"]))
        expected = paired_difference(sides[(key[0], "none", key[2])], sides[key])
        assert math.isclose(float(record["difference"]), expected.delta, abs_tol=1e-6)
        assert math.isclose(float(record["difference_low"]), expected.low, abs_tol=1e-6)
        assert record["expected"] == "up"
        assert (record["mcnemar_p"] != "") == (key[2] == 0.0)  # greedy only
    greedy = [r for r in records if r["perturbation"] == "append_question:specific"
              and float(r["temperature"]) == 0]
    assert all(float(r["difference"]) > 0 and r["verdict"].startswith("expected")
               for r in greedy)  # the scripted models answer an appended question


def test_joint_table_splits_right_and_wrong_answers(run_folder):
    store = RunStore.open(run_folder)
    report = load_run(store).report()
    store.close()
    by_model = {c.model: j for c, j in report.joints if c.temperature == 0.0}
    assert by_model["fake/alpha"].items_correct == 3
    assert by_model["fake/beta"].items_correct == 1
    assert by_model["fake/beta"].items_wrong == 5


def test_three_models_give_a_rank_correlation(tmp_path):
    models = ["fake/alpha", "fake/beta", "fake/gamma"]
    store = build_report_run(tmp_path, models, temperatures=[0.0], perturbations=[])
    report = load_run(store).report()
    out = write_html_report(report, tmp_path / "report.html")
    files = export_tables(report, tmp_path / "tables")
    store.close()
    html = out.read_text(encoding="utf-8")
    assert "Spearman ρ = " in html or "Spearman ρ undefined" in html
    assert '<svg class="plot forest"' not in html  # no perturbations: no forest plot
    (record,) = read_csv(tmp_path / "tables" / "rank_correlation.csv")
    assert int(record["models"]) == 3
    assert tmp_path / "tables" / "summary.csv" in files


# -- the page in a real browser ------------------------------------------------------------------


def test_page_in_headless_chromium(browser, report_html, run_folder, tmp_path):
    from playwright.sync_api import expect

    store = RunStore.open(run_folder)
    turns = read_turns(store)
    store.close()
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    page.set_default_timeout(10_000)
    page.goto(report_html.resolve().as_uri())
    expect(page.locator("#total-count")).to_have_text(str(len(turns)))
    expect(page.locator("#match-count")).to_have_text(str(len(turns)))
    assert page.evaluate("typeof window.__pwned") == "undefined"

    def choose(field: str, value: str, keep) -> None:
        page.select_option(f"#f-{field}", value)
        count = sum(1 for t in turns if keep(t))
        expect(page.locator("#match-count")).to_have_text(str(count))
        expect(page.locator("#cards > details")).to_have_count(min(count, 20))

    choose("model", "fake/beta", lambda t: t.model == "fake/beta")
    choose("perturbation", "truncate",
           lambda t: t.model == "fake/beta" and t.perturbation == "truncate")
    choose("status", "follow_up", lambda t: t.model == "fake/beta"
           and t.perturbation == "truncate" and t.status == "follow_up")
    page.click("#reset")
    choose("status", "undecided", lambda t: t.status == "undecided")
    page.click("#reset")

    # markup written by a model is shown as text
    page.select_option("#f-model", "fake/alpha")
    page.select_option("#f-temperature", "0")
    page.select_option("#f-perturbation", "none")
    first = page.locator("#cards > details").first
    first.locator("summary").click()  # a turn opens from its row into its card
    expect(first.locator(".turn .txt")).to_have_text(BOLD)
    assert page.locator("#cards b, #cards img, #cards script").count() == 0

    # the exact prompt, behind its toggle
    key = first.get_attribute("data-key")
    prompt = next(t.prompt for t in turns if t.key == key)
    expect(first.locator("pre.prompt")).to_have_count(0)
    first.locator("button.show").click()
    expect(first.locator("pre.prompt")).to_be_visible()
    assert first.locator("pre.prompt").text_content() == prompt
    assert first.locator("button.show").text_content() == "hide prompt"
    page.evaluate("window.scrollTo(0, 0)")
    shot = tmp_path / "report.png"  # filtered to 6 turns, one prompt open
    page.screenshot(path=str(shot), full_page=True)
    shutil.copy(shot, "/tmp/report.png")

    page.fill("#f-search", "bold")
    expect(page.locator("#match-count")).to_have_text(str(sum(
        1 for t in turns if t.model == "fake/alpha" and t.temperature == 0
        and t.perturbation == "none" and "bold" in t.user_turn)))
    page.click("#reset")
    page.wait_for_timeout(50)
    assert page.evaluate("typeof window.__pwned") == "undefined"
    page.close()
    assert errors == []
    assert all(url.startswith("file://") for url in requests), requests
    assert Counter(t.status for t in turns)["undecided"] > 0


# -- the page as a researcher reads it (issue #43) ----------------------------------------------
TABLE_WIDTHS = """() => Array.from(document.querySelectorAll("main table")).map((table) => {
    const wrap = table.closest(".table-wrap");
    return [table.closest("section").id, Math.round(table.getBoundingClientRect().width),
            Math.round(wrap.getBoundingClientRect().width)];
})"""


@pytest.mark.parametrize("width", [1280, 1920])
def test_with_human_labels_no_table_is_wider_than_its_column(browser, report_html, run_folder,
                                                             width):
    html = report_html.read_text(encoding="utf-8")
    assert "human only [95% CI]" in html  # the run has human labels: the widest summary
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.goto(report_html.resolve().as_uri())
    page.evaluate("document.querySelectorAll('details').forEach((d) => { d.open = true; })")
    widths = page.evaluate(TABLE_WIDTHS)
    page.close()
    assert {section for section, _, _ in widths} >= {"summary", "perturbations", "agreement"}
    assert [w for w in widths if w[1] > w[2]] == []  # (section, table px, column px)


def test_the_sample_browser_filters_by_condition_and_label_with_counts(browser, report_html,
                                                                        run_folder):
    from playwright.sync_api import expect

    store = RunStore.open(run_folder)
    turns = read_turns(store)
    store.close()
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(10_000)
    page.goto(report_html.resolve().as_uri())

    def shown_keys() -> set[str]:
        return set(page.locator("#cards > details").evaluate_all(
            "cards => cards.map((c) => c.dataset.key)"))

    # Every label is a chip with its count over all turns.
    counts = Counter(t.status for t in turns)
    for status, n in counts.items():
        chip = page.locator(f'#label-chips button[data-status="{status}"]')
        expect(chip.locator(".n")).to_have_text(str(n))
    # A condition (model, temperature, perturbation), then a label by its chip.
    page.select_option("#f-model", "fake/beta")
    page.select_option("#f-temperature", "1")
    page.select_option("#f-perturbation", "truncate")
    condition = [t for t in turns if (t.model, t.temperature, t.perturbation)
                 == ("fake/beta", 1.0, "truncate")]
    expect(page.locator("#match-count")).to_have_text(str(len(condition)))
    in_condition = Counter(t.status for t in condition)
    label, n = in_condition.most_common(1)[0]
    # The options and chips count what the other filters leave: what choosing them would show.
    expect(page.locator(f'#label-chips button[data-status="{label}"] .n')).to_have_text(str(n))
    expect(page.locator('#f-perturbation option[value="truncate"]')).to_have_text(
        f"truncate ({len(condition)})")
    page.click(f'#label-chips button[data-status="{label}"]')
    expect(page.locator("#f-status")).to_have_value(label)
    expect(page.locator("#match-count")).to_have_text(str(n))
    assert shown_keys() == {t.key for t in condition if t.status == label}
    page.click("#reset")

    # Pages of 20 collapsed rows; a row opens into its card.
    expect(page.locator("#page-info")).to_have_text(
        f"turns 1–20 of {len(turns)} · page 1 of {math.ceil(len(turns) / 20)}")
    first_page = shown_keys()
    page.click("#next")
    expect(page.locator("#page-info")).to_contain_text(f"turns 21–40 of {len(turns)}")
    assert len(shown_keys()) == 20 and not shown_keys() & first_page
    expect(page.locator("#cards .cols")).to_have_count(0)  # nothing opened yet
    height = page.evaluate("document.getElementById('samples').getBoundingClientRect().height")
    assert height < 2000, height  # 336 turns; the cards inline were 15,000 px
    page.close()


def test_a_perturbation_that_cannot_apply_says_how_many_items_it_left_out_and_where(
        gsm_file, tmp_path, capsys):
    from helpers import experiment, is_user_turn

    from userturn.backends.fake import ScriptedBackend
    from userturn.cli.main import main
    from userturn.probe.pipeline import run_experiment

    def script(request) -> str:  # four of six answers have no number to change
        if is_user_turn(request):
            return "Thanks!"
        return "#### 26" if "3 boxes" in request.prompt or "45 apples" in request.prompt \
            else "I am not sure how to solve this."

    exp = experiment(gsm_file, tmp_path, perturbations=["wrong_answer", "truncate"])
    run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(script)}).close()
    wrong = {t.item_id for t in load_run(exp.plan.output).turns() if t.perturbation == "wrong_answer"}
    assert len(wrong) == 2  # what the run made: the perturbation left four items out
    line = ("wrong_answer could not change 4 of 6 answers of fake/scripted · mini_gsm (the answer "
            "has no number to change): those items have no wrong_answer turns and are left out of "
            "its comparison")
    assert main(["report", str(exp.plan.output), "--html"]) == 0
    assert line in " ".join(capsys.readouterr().out.split())
    page = (exp.plan.output / "report.html").read_text(encoding="utf-8")
    assert "wrong_answer could not change 4 of 6 answers of fake/scripted" in page
    assert "truncate could not" not in page  # every answer could be cut


def test_the_offline_caveat_says_how_far_off_on_what_and_the_fix_and_links_the_docs(
        report_html):
    import html as html_module

    from userturn.labels.offline_error import CARDS, offline_error

    html = report_html.read_text(encoding="utf-8")
    caveat = re.search(r'<p class="note warn-note">(offline labels[^<]*(?:<a [^>]*>[^<]*</a>'
                       r'[^<]*)*)</p>', html)
    assert caveat, "the offline caveat is set apart from the grey notes"
    text = html_module.unescape(re.sub(r"<[^>]+>", "", caveat.group(1)))
    # How far off (the card of the labels that decide), on what, and the fix.
    gaps = {(f"{e.mean_gap:.1f}", f"{e.max_gap:.0f}") for e in map(offline_error, CARDS.values())
            if e is not None}
    far = re.search(r"off from people's by (\d+\.\d) points on average and up to (\d+) in one "
                    r"condition \((SmolLM2-135M, [^;]+);", text)
    assert far and far.groups()[:2] in gaps
    assert "never fit to" in text and "userturn annotate RUN" in text
    for internal in ("lomo_round10.txt", "unseen_people.txt", "benchmarks/"):
        assert internal not in text  # the project's own files mean nothing to a reader
    docs = Path(__file__).resolve().parents[1] / "docs" / "classifier.md"
    assert f'<a href="{docs.as_uri()}">docs/classifier.md</a>' in caveat.group(1)
