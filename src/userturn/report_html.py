"""The sections of the HTML report, laid out from a computed :class:`~userturn.report.Report`.

Only run metadata and numbers are written into the page as HTML (escaped); model-written text
travels in the JSON block and is shown by the page's script with ``textContent``.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from typing import Any, Sequence

from . import plots
from .report import CATEGORIES, Comparison, Panel, Report, Row, esc, fill, json_for_script, now
from .stats import McNemar, Rate

NOTE_UNDECIDED = ("undecided turns count as not follow-up, so a rate is a lower bound until a "
                  "judge labels them; invalid verdicts and failed generations are left out of the "
                  "rate and counted beside it.")


def render_page(report: Report, template: str, data: dict[str, Any], links: Sequence[str]) -> str:
    sections = [_summary(report), _temperature(report), _accuracy(report), _labels(report),
                _perturbations(report), _right_wrong(report), _samples(), _export(links)]
    nav = "".join(f'<a href="#{sid}">{esc(title)}</a>' for sid, title in _NAV
                  if sid != "perturbations" or report.comparisons)
    return fill(template, {"TITLE": esc(f"userturn report: {report.folder.name}"),
                           "RUN": esc(report.folder.name),
                           "HEADER": _header(report), "NAV": nav,
                           "BODY": "\n".join(s for s in sections if s),
                           "DATA": json_for_script(data)})


_NAV = [("summary", "Summary"), ("temperature", "Temperature"), ("accuracy", "Accuracy"),
        ("labels", "Labels"), ("perturbations", "Perturbations"), ("right-wrong", "Right vs wrong"),
        ("samples", "Samples"), ("export", "Export")]


# -- small formatters ------------------------------------------------------------------------------
def temp(value: float) -> str:
    return "0 (greedy)" if value <= 0 else f"{value:g}"


def rate_html(rate: Rate | None) -> str:
    if rate is None or rate.n == 0:
        return '<span class="na">–</span>'
    return (f'<span class="v">{plots.pct(rate.value)}</span> '
            f'<span class="ci">[{_pp(rate.low)}–{_pp(rate.high)}]</span>')


def _pp(value: float, sign: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{100 * value:+.0f}".replace("-", "−") if sign else f"{100 * value:.0f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, numeric_from: int,
           cls: str = "", groups: Sequence[bool] = (), headings: Sequence[str] = ()) -> str:
    """An HTML table; ``groups`` marks rows that start a group (a rule above them),
    ``headings`` gives each row a group heading, shown as a row of its own when it changes."""
    head = "".join(f'<th class="{"num" if i >= numeric_from else ""}">{h}</th>'
                   for i, h in enumerate(headers))
    body = []
    for r, cells in enumerate(rows):
        if headings and (r == 0 or headings[r] != headings[r - 1]):
            body.append(f'<tr class="heading"><th colspan="{len(headers)}">{esc(headings[r])}'
                        f"</th></tr>")
        tds = "".join(f'<td class="{"num" if i >= numeric_from else ""}">{c}</td>'
                      for i, c in enumerate(cells))
        first = ' class="group-start"' if groups and groups[r] else ""
        body.append(f"<tr{first}>{tds}</tr>")
    return (f'<div class="table-wrap"><table class="{cls}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def _group_starts(keys: Sequence[Any]) -> list[bool]:
    return [i > 0 and keys[i] != keys[i - 1] for i in range(len(keys))]


def _section(sid: str, title: str, intro: str, body: str) -> str:
    return (f'<section id="{sid}"><h2>{esc(title)}</h2><p class="intro">{intro}</p>'
            f"{body}</section>")


def _keys(report: Report) -> list[str]:
    return [k for k in ("answerer", "dataset", "perturbation") if report.varies(k)]


# -- header ----------------------------------------------------------------------------------------
def _header(report: Report) -> str:
    meta, config = report.meta, report.meta.get("config", {})
    items = [("Run folder", f"<code>{esc(report.folder)}</code>"),
             ("Report written", esc(now()))]
    for key, name in (("started", "Run started"), ("finished", "Run finished")):
        if key == "finished" and (report.state is None or not report.state.finished):
            continue  # a finish stamp of an earlier run, before this one started: not this run's
        if isinstance(meta.get(key), (int, float)):
            stamp = dt.datetime.fromtimestamp(meta[key], dt.timezone.utc)
            items.append((name, esc(stamp.strftime("%Y-%m-%d %H:%M UTC"))))
    state = report.state
    if state is not None:
        status = state.line() or ("finished: " + state.counts())
        items.append(("Run status", f'<span class="{"" if state.line() is None else "warn"}">'
                      f"{esc(status)}</span>"))
        if state.skipped_line():
            items.append(("Skipped rows", esc(state.skipped_line())))
    turns = len(report.turns)
    items_seen = len({(t["dataset"], t["item_id"]) for t in report.turns})
    items.append(("User turns", f"{turns} ({items_seen} items)"))
    items.append(("Labels decided by", esc(", then ".join(report.sources)) or "–"))
    counts = defaultdict(int)
    for labels in report.all_labels.values():
        for label in labels:
            counts[label["source"]] += 1
    items.append(("Label sources stored", esc(", ".join(f"{s} ({n})" for s, n in
                                                       sorted(counts.items()))) or "none"))
    versions = meta.get("versions", {})
    items.append(("Versions", esc(" · ".join(f"{k} {v}" for k, v in versions.items())) or "–"))
    models = meta.get("models", {})
    if models:
        items.append(("Models", "<br>".join(
            f"{esc(m)} <span class='muted'>revision {esc(v.get('revision'))}, template "
            f"{esc(v.get('template_hash'))}</span>" for m, v in models.items())))
    facts = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items)
    settings = "".join(f'<div><span class="k">{esc(k)}</span> {esc(_setting(v))}</div>'
                       for k, v in config.items())
    return (f'<p class="design">{esc(_design(config))}</p><dl class="facts">{facts}</dl>'
            f'<details class="config"><summary>Full experiment config</summary>'
            f'<div class="settings">{settings}</div></details>')


def _design(config: dict[str, Any]) -> str:
    """One line: the experiment's design, e.g. 2 models × 1 dataset × T {0, 1} × 4 samples."""
    if not config:
        return "No experiment config stored in this run."
    many = lambda key, word: _plural(len(config.get(key) or []), word)  # noqa: E731
    temps = ", ".join(f"{t:g}" for t in config.get("temperatures", []))
    parts = [many("models", "model"), many("datasets", "dataset"), f"T {{{temps}}}",
             f"{config.get('samples')} samples per item at T > 0"]
    if config.get("perturbations"):
        parts.append(f"{many('perturbations', 'perturbation')} + original")
    if [a for a in config.get("answerers", []) if a != "self"]:
        parts.append(f"answerers: {', '.join(config['answerers'])}")
    if config.get("enable_thinking") is not None:
        parts.append("thinking " + "/".join("on" if v else "off"
                                            for v in config["enable_thinking"]))
    limit = config.get("limit")
    # The answer's thinking in the user-turn prompt: the policy changes what the prober saw.
    policy = f", answer thinking {config['thinking']}" if config.get("thinking") else ""
    return " × ".join(parts) + f"; {'all' if limit is None else limit} items per dataset, " \
        f"seed {config.get('seed')}{policy}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _setting(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "–"
    return "–" if value is None else str(value)


# -- summary ---------------------------------------------------------------------------------------
def _summary(report: Report) -> str:
    keys = _keys(report)
    headers = ["model", *keys, "T", "items", "turns", "follow-up [95% CI]", "n", "undecided",
               "invalid", "errors", "accuracy [95% CI]", "n"]
    rows = [[esc(r.model), *(esc(getattr(r, k)) for k in keys), temp(r.temperature),
             str(r.items), str(r.turns), rate_html(r.follow_up), str(r.follow_up.n),
             _count(r.undecided, False), _count(r.invalid), _count(r.errors), rate_html(r.accuracy),
             str(r.accuracy.n) if r.accuracy else "–"] for r in report.rows]
    table = _table(headers, rows, numeric_from=1 + len(keys),
                   groups=_group_starts([r.model for r in report.rows]))
    label_rows = [[esc(r.model), *(esc(getattr(r, k)) for k in keys), temp(r.temperature),
                   *(str(r.labels.get(key, 0)) for key, _ in CATEGORIES[:-3]),
                   _count(r.undecided), _count(r.invalid), _count(r.errors)] for r in report.rows]
    counts = _table(["model", *keys, "T", *(esc(name) for _, name in CATEGORIES)], label_rows,
                    numeric_from=1 + len(keys),
                    groups=_group_starts([r.model for r in report.rows]))
    notes = [f"n: turns the rate is over; {NOTE_UNDECIDED}",
             "Task accuracy: the score of the greedy assistant answer the turns follow (one per "
             "item). Intervals: 95% percentile bootstrap over items (samples of an item are not "
             "independent)."]
    if report.assistant_failures:
        notes.append(f"{report.assistant_failures} assistant turn(s) failed; their items have no "
                     "user turns.")
    body = (table + "".join(f'<p class="note">{esc(n)}</p>' for n in notes)
            + f"<details><summary>Label counts per row</summary>{counts}</details>")
    return _section("summary", "Summary", "Genuine follow-up rate of the generated user turns, "
                    "per model and condition.", body)


def _count(value: int, warn: bool = True) -> str:
    return f'<span class="warn">{value}</span>' if value and warn else str(value)


# -- plot 1 ----------------------------------------------------------------------------------------
def _temperature(report: Report) -> str:
    groups: dict[tuple[str, str, str], list[Row]] = defaultdict(list)
    for r in report.rows:
        if r.perturbation == "none":
            groups[(r.model, r.answerer, r.dataset)].append(r)
    order = sorted(groups, key=lambda k: (_model_index(report, k[0]), k[1] != "self", k[1:]))
    series = [plots.Series(report.condition(*key), plots.model_colour(i), [
        plots.Point(r.temperature, r.follow_up.value, r.follow_up.low, r.follow_up.high,
                    f"{report.condition(*key)}, T = {temp(r.temperature)}: "
                    f"{plots.pct(r.follow_up.value)} [{_pp(r.follow_up.low)}–"
                    f"{_pp(r.follow_up.high)}], n = {r.follow_up.n}")
        for r in sorted(groups[key], key=lambda r: r.temperature) if r.follow_up.n])
        for i, key in enumerate(order)]
    intro = ("Follow-up rate on the unperturbed contexts at each sampling temperature, one line "
             "per model; the band is the 95% interval bootstrapped over items. T = 0 is greedy "
             "decoding (one turn per item). Hover a point for its numbers.")
    if not any(s.points for s in series):
        return _section("temperature", "Follow-up rate vs temperature", intro, _EMPTY_RATES)
    svg = plots.rate_lines(series, x_label="Sampling temperature",
                           y_label="Genuine follow-up rate")
    return _section("temperature", "Follow-up rate vs temperature", intro,
                    f'<figure>{svg}</figure>')


_EMPTY_RATES = ('<p class="empty">No follow-up rate to plot: no unperturbed user turn was '
                'generated and labelled.</p>')


def _row_temp(value: float) -> str:
    return "greedy" if value <= 0 else f"T = {value:g}"


def _model_index(report: Report, model: str) -> int:
    return report.models.index(model) if model in report.models else len(report.models)


# -- plot 2 ----------------------------------------------------------------------------------------
def _accuracy(report: Report) -> str:
    intro = ("One point per model: task accuracy of its greedy answers (x) against the "
             "follow-up rate of the user turns written after them (y, unperturbed contexts), "
             "with 95% intervals both ways. Spearman's ρ across models, with a bootstrap "
             "interval over models, tests whether the two go together.")
    if not report.panels or not any(p.points for p in report.panels):
        return _section("accuracy", "Task accuracy vs follow-up rate", intro,
                        '<p class="empty">No model has both scored answers and a follow-up '
                        'rate (unperturbed, answered by itself).</p>')
    highs = [rate.high for p in report.panels for _, _, rate in p.points]
    y_top, step = plots.nice_top(max([h for h in highs if math.isfinite(h)] or [0.1]))
    svgs = [plots.scatter_panel(_panel_title(report, p), _rho(p), _dots(report, p), y_top=y_top,
                                step=step, x_label="Task accuracy",
                                y_label="Follow-up rate") for p in report.panels]
    legend = "".join(f'<span class="key"><i style="background:{plots.model_colour(i)}"></i>'
                     f"{esc(m)}</span>" for i, m in enumerate(report.models))
    body = (f'<div class="legend">{legend}</div><div class="panels">'
            + "".join(f"<figure>{s}</figure>" for s in svgs) + "</div>")
    return _section("accuracy", "Task accuracy vs follow-up rate", intro, body)


def _panel_title(report: Report, panel: Panel) -> str:
    title = f"T = {temp(panel.temperature)}"
    return f"{panel.dataset} · {title}" if report.varies("dataset") else title


def _rho(panel: Panel) -> str:
    c = panel.correlation
    if c.n < 3:
        return f"{c.n} model{'s' if c.n != 1 else ''}: too few for Spearman ρ (needs ≥ 3)"
    if not math.isfinite(c.rho):
        return f"Spearman ρ undefined: one side is constant ({c.n} models)"
    interval = "" if not math.isfinite(c.low) else f" [{c.low:+.2f}, {c.high:+.2f}]"
    return f"Spearman ρ = {c.rho:+.2f}{interval}, {c.n} models"


def _dots(report: Report, panel: Panel) -> list[plots.Dot]:
    return [plots.Dot(model, plots.model_colour(_model_index(report, model)), acc.value,
                      acc.low, acc.high, rate.value, rate.low, rate.high,
                      f"{model}: accuracy {plots.pct(acc.value)} [{_pp(acc.low)}–{_pp(acc.high)}]"
                      f" n = {acc.n}; follow-up {plots.pct(rate.value)} [{_pp(rate.low)}–"
                      f"{_pp(rate.high)}] n = {rate.n}") for model, acc, rate in panel.points]


# -- plot 3 ----------------------------------------------------------------------------------------
def _labels(report: Report) -> str:
    rows = sorted(report.rows, key=lambda r: (_model_index(report, r.model), r.answerer,
                                              r.dataset, r.temperature, r.perturbation != "none",
                                              r.perturbation))
    bars = [plots.Bar(report.condition(r.model, r.answerer, r.dataset),
                      _row_temp(r.temperature) + (f" · {r.perturbation}"
                                                      if report.varies("perturbation") else ""),
                      {**r.labels, "undecided": r.undecided, "invalid": r.invalid,
                       "failed": r.errors}) for r in rows]
    intro = ("What the generated user turns are: the share of each label per model, "
             "temperature and perturbation (each bar is all turns of its row; greys have no "
             "label). Hover a segment for its count.")
    if not bars:
        return _section("labels", "Label distribution", intro,
                        '<p class="empty">No user turns in this run.</p>')
    svg = plots.stacked_bars(bars, CATEGORIES)
    return _section("labels", "Label distribution", intro, f"<figure>{svg}</figure>")


# -- plot 4 ----------------------------------------------------------------------------------------
def _perturbations(report: Report) -> str:
    cs = report.comparisons
    if not cs:
        return ""
    cs = sorted(cs, key=lambda c: (_model_index(report, c.model), c.answerer, c.dataset,
                                   c.perturbation, c.temperature))
    rows = [plots.ForestRow(report.condition(c.model, c.answerer, c.dataset),
                            f"{c.perturbation} · {_row_temp(c.temperature)}", c.diff.delta,
                            c.diff.low, c.diff.high, c.verdict, _forest_note(c), _forest_tip(c))
            for c in cs]
    svg = plots.forest(rows, x_label="Perturbed minus original follow-up rate (percentage points)")
    intro = ("Each perturbation of the assistant answer is paired with the original context of "
             "the same items: the difference in follow-up rate (perturbed minus original) with a "
             "95% paired bootstrap interval over shared items. Every perturbation is expected to "
             "raise the rate (a model that reads the conversation reacts to the change). For "
             "greedy decoding (one turn per item) McNemar's exact p is given too.")
    return _section("perturbations", "Perturbations: paired differences", intro,
                    f"<figure>{svg}</figure>" + _comparison_table(report, cs))


def _forest_note(c: Comparison) -> str:
    d = c.diff
    if not d.items:
        return "no shared items"
    text = f"{_pp(d.delta, True)} [{_pp(d.low, True)}, {_pp(d.high, True)}] pp · {d.items} items"
    return text + (f" · p = {_p(c.mcnemar.p_value)}" if c.mcnemar else "")


def _forest_tip(c: Comparison) -> str:
    d = c.diff
    return (f"{c.model} · {c.perturbation} · T = {temp(c.temperature)}: original "
            f"{plots.pct(d.a.value)} (n = {d.a.n}), perturbed {plots.pct(d.b.value)} "
            f"(n = {d.b.n}); {plots.VERDICTS[c.verdict][0]}")


def _p(value: float) -> str:
    return "<0.001" if value < 0.001 else f"{value:.3f}" if value < 0.1 else f"{value:.2f}"


_MARKS = {"expected": "yes", "expected_ns": "yes, n.s.", "opposite_ns": "no, n.s.",
          "opposite": "no, opposite", "none": "no change"}


def _comparison_table(report: Report, cs: Sequence[Comparison]) -> str:
    headers = ["perturbation", "T", "items", "original [95% CI]", "perturbed [95% CI]",
               "difference, pp [95% CI]", "as expected?", "McNemar p", "dropped"]
    rows = []
    for c in cs:
        d, m = c.diff, c.mcnemar
        arrow = "↑" if c.expected == "up" else "↓"
        rows.append([esc(c.perturbation), _short_temp(c.temperature), str(d.items),
                     _rate_n(d.a), _rate_n(d.b),
                     f'<span class="v">{_pp(d.delta, True)}</span> <span class="ci">'
                     f'[{_pp(d.low, True)}, {_pp(d.high, True)}]</span>',
                     f'<span class="verdict {c.verdict}">{arrow} {_MARKS[c.verdict]}</span>',
                     _mcnemar_cell(m),
                     f"{d.dropped_a} / {d.dropped_b}"])
    note = ("↑: the rate is expected to rise; n.s.: the interval includes 0. McNemar (greedy "
            "only, one turn per item): exact p, with the items that switched to a follow-up (↑) "
            "and away from one (↓). dropped: items with turns on the original / perturbed side "
            "only (a perturbation that does not apply to an item, e.g. no number to change).")
    headings = [report.condition(c.model, c.answerer, c.dataset) for c in cs]
    return (_table(headers, rows, numeric_from=1, headings=headings, cls="grouped")
            + f'<p class="note">{esc(note)}</p>')


def _short_temp(value: float) -> str:
    return "greedy" if value <= 0 else f"{value:g}"


def _mcnemar_cell(m: McNemar | None) -> str:
    if m is None:
        return "–"
    return f"{_p(m.p_value)} <span class='ci'>({m.b01}↑ {m.b10}↓)</span>"


def _rate_n(rate: Rate) -> str:
    return f'{rate_html(rate)} <span class="ci">n={rate.n}</span>'


# -- joint table -----------------------------------------------------------------------------------
def _right_wrong(report: Report) -> str:
    intro = ("Does the model follow up more when its answer was wrong? The follow-up rate of "
             "the turns after a right answer vs after a wrong one (unperturbed contexts), "
             "clustered by item. The two rates come from different items: compare their "
             "intervals, not a paired difference.")
    if not report.joints:
        return _section("right-wrong", "Right vs wrong answers", intro,
                        '<p class="empty">No scored assistant answers in this run.</p>')
    keys = [k for k in ("answerer", "dataset") if report.varies(k)]
    headers = ["model", *keys, "T", "after a right answer [95% CI]", "turns", "items",
               "after a wrong answer [95% CI]", "turns", "items", "items in both"]
    rows = [[esc(model), *(esc(v) for k, v in (("answerer", answerer), ("dataset", dataset))
                          if k in keys), temp(t), rate_html(j["correct"]), str(j["correct"].n),
             str(j["items_correct"]), rate_html(j["wrong"]), str(j["wrong"].n),
             str(j["items_wrong"]), str(j["items_mixed"])]
            for (model, answerer, dataset, t), j in report.joints]
    return _section("right-wrong", "Right vs wrong answers", intro,
                    _table(headers, rows, numeric_from=1 + len(keys),
                           groups=_group_starts([k[0][0] for k in report.joints])))


# -- samples and export ----------------------------------------------------------------------------
def _samples() -> str:
    selects = "".join(f'<label>{name}<select id="f-{field}" data-field="{field}"></select></label>'
                      for field, name in (("model", "Model"), ("answerer", "Answerer"),
                                          ("dataset", "Dataset"), ("temperature", "Temperature"),
                                          ("perturbation", "Perturbation"), ("status", "Label")))
    intro = ("Every generated user turn with the query, the assistant answer it followed, every "
             "label from every source, and the exact prompt. Model text is shown literally.")
    body = (f'<div class="filters">{selects}<label class="search">Search<input id="f-search" '
            f'type="search" placeholder="query, answer, user turn, rationale…"></label>'
            f'<button id="reset" type="button">Reset</button></div>'
            f'<p class="count"><b id="match-count">0</b> of <span id="total-count">0</span> '
            f'user turns match</p><div id="cards"></div>'
            f'<button id="more" type="button" hidden>Show more</button>'
            f'<noscript><p class="empty">The sample browser needs JavaScript; the same turns are '
            f'in user_turns.csv.</p></noscript>')
    return _section("samples", "Samples", intro, body)


def _export(links: Sequence[str]) -> str:
    if not links:
        body = ('<p class="note">Every table of this report can be written as CSV (and Parquet) '
                'with <code>userturn.report.export_tables(store, folder)</code>.</p>')
    else:
        body = "<ul class='files'>" + "".join(f'<li><a href="{esc(link)}">{esc(link)}</a></li>'
                                              for link in links) + "</ul>"
    return _section("export", "Export", "The tables of this report as files.", body)
