"""The sections of the HTML report, laid out from a computed :class:`~userturn.report.compute.Report`:
the summary, the four plots (inline SVG, from :mod:`.charts`), right vs wrong answers, the sample
browser and the export links."""

from __future__ import annotations

from typing import Sequence

from userturn.records import LABELS, VERDICT_ERROR
from userturn.report import charts, columns, plots
from userturn.report.compute import CATEGORIES, Report, categories
from userturn.report.markup import count, esc, group_starts, rate_html, section, table
from userturn.report.numbers import (
    decimal,
    label_header,
    p_value,
    percent,
    points,
    temperature,
    temperature_axis,
)
from userturn.report.summary import correction_hint, offline_notes
from userturn.stats.arms import arm_rows
from userturn.stats.correction import MIN_HUMAN_LABELS
from userturn.stats.effects import PerturbationEffect
from userturn.stats.rates import Difference, McNemar, Rate
from userturn.stats.summary import SummaryRow

NOTE_UNDECIDED = ("undecided turns count as not follow-up, so a rate is a lower bound until a "
                  "judge labels them; failed generations are left out of the rate and counted "
                  "beside it. Label errors: turns where a label source's verdict failed (a judge "
                  "request that failed, a reply outside the label set); each kept the next "
                  "source's label, so a failed verdict never moves the rate.")


# -- summary ---------------------------------------------------------------------------------------
def summary(report: Report) -> str:
    groups = group_starts([r.probed for r in report.rows])
    main = _columns_table(columns.page_columns(report.rows), report.rows, groups=groups)
    keys = columns.page_columns(report.rows, conditions=True)
    shown = categories(report.rows)
    label_rows = [[cell for c in keys for cell in c.html(r)]
                  + [str(r.labels.get(key, 0)) for key in LABELS]
                  + [count(r.undecided), count(r.errors)]
                  + ([count(r.no_user_turn)] if len(shown) == len(CATEGORIES) else [])
                  for r in report.rows]
    counts = table([esc(header) for c in keys for header in c.page_headers()]
                   + [esc(name) for _, name in shown], label_rows,
                   numeric=[c.format.numeric for c in keys] + [True] * len(shown),
                   groups=groups)
    humans = any(r.human_labels for r in report.rows)
    notes = [f"n: turns the rate is over; {NOTE_UNDECIDED}",
             "Task accuracy: the score of the greedy assistant answer the turns follow (one per "
             "item). Intervals: 95% clustered Wilson intervals (the effective sample size the items' "
             "spread leaves, as samples of an item are not independent; docs/statistics.md)."]
    if humans:
        notes.append("Corrected: the follow-up rate corrected for the labeller's errors with the "
                     "human-labelled turns (prediction-powered inference, PPI++, clustered by item "
                     "and weighted by each turn's chance of being in the calibration sample; "
                     f"shown from {MIN_HUMAN_LABELS} human labels on; docs/statistics.md). Human "
                     "only: the same rate from the human labels alone; the corrected interval is "
                     "narrower where the labeller's verdicts carry information.")
        notes += [f"{r.probed} · {r.dataset} · T = {temperature(r.temperature)}: no correction: "
                  f"{r.correction_note}." for r in report.rows if r.correction_note]
        if any(r.labels_to_correct for r in report.rows):
            notes.append(correction_hint(report.rows) + ".")
    notes += offline_notes(report.rows, report.sources)
    if report.assistant_failures:
        notes.append(f"{report.assistant_failures} assistant turn(s) failed; their items have no "
                     "user turns.")
    body = (main + "".join(f'<p class="note">{esc(n)}</p>' for n in notes)
            + f"<details><summary>Label counts per row</summary>{counts}</details>")
    return section("summary", "Summary", "Genuine follow-up rate of the generated user turns, "
                    "per model and condition.", body)


def _columns_table(shown: Sequence[columns.Column], rows: Sequence[SummaryRow], *,
                   groups: Sequence[bool]) -> str:
    """The page's table of ``shown`` columns, one row per summary row (a rate brings its n)."""
    return table([esc(header) for c in shown for header in c.page_headers()],
                 [[cell for c in shown for cell in c.html(r)] for r in rows],
                 numeric=[c.format.numeric for c in shown for _ in c.page_headers()],
                 groups=groups)


# -- plot 1 ----------------------------------------------------------------------------------------
def temperature_plot(report: Report) -> str:
    series = charts.temperature_series(report)
    intro = ("Follow-up rate on the unperturbed contexts at each sampling temperature, one line "
             "per model; the band is the 95% interval clustered by item. T = 0 is greedy "
             "decoding (one turn per item). Hover a point for its numbers.")
    if not any(s.points for s in series):
        return section("temperature", "Follow-up rate vs temperature", intro, _EMPTY_RATES)
    svg = plots.rate_lines(series, x_label=charts.RATE_X_LABEL, y_label=charts.RATE_Y_LABEL)
    return section("temperature", "Follow-up rate vs temperature", intro,
                    f'<figure>{svg}</figure>')


_EMPTY_RATES = ('<p class="empty">No follow-up rate to plot: no unperturbed user turn was '
                'generated and labelled.</p>')


# -- plot 2 ----------------------------------------------------------------------------------------
def accuracy_plot(report: Report) -> str:
    intro = ("One point per model: task accuracy of its greedy answers (x) against the "
             "follow-up rate of the user turns written after them (y, unperturbed contexts), "
             "with 95% intervals both ways. Spearman's ρ across models, with a bootstrap "
             "interval over models, tests whether the two go together.")
    if not report.panels or not any(p.points for p in report.panels):
        return section("accuracy", "Task accuracy vs follow-up rate", intro,
                        '<p class="empty">No model has both scored answers and a follow-up '
                        'rate (unperturbed, answered by itself).</p>')
    if charts.too_few_to_plot(report):
        return section("accuracy", "Task accuracy vs follow-up rate", intro,
                       _accuracy_table(report))
    y_top, step = charts.panel_scale(report)
    svgs = [plots.scatter_panel(charts.panel_title(report, p), charts.rho_note(p),
                                charts.panel_dots(report, p), y_top=y_top,
                                step=step, x_label="Task accuracy",
                                y_label="Follow-up rate") for p in report.panels]
    legend = "".join(f'<span class="key"><i style="background:{plots.model_colour(i)}"></i>'
                     f"{esc(m)}</span>" for i, m in enumerate(report.models))
    body = (f'<div class="legend">{legend}</div><div class="panels">'
            + "".join(f"<figure>{s}</figure>" for s in svgs) + "</div>")
    return section("accuracy", "Task accuracy vs follow-up rate", intro, body)


def _accuracy_table(report: Report) -> str:
    """The panels' numbers where each has one model: a table, and why there is no plot."""
    keys = ["dataset"] if report.varies("dataset") else []
    rows = [[esc(point.model), *(esc(p.dataset) for _ in keys), temperature_axis(p.temperature),
             rate_html(point.accuracy), str(point.accuracy.n), rate_html(point.follow_up),
             str(point.follow_up.n)]
            for p in report.panels for point in p.points]
    models = len({point.model for p in report.panels for point in p.points})
    note = (f"{models} model{'s' if models != 1 else ''} with scored "
            "answers: the relation across models needs at least two to plot and three for "
            "Spearman's ρ, so the numbers are shown instead.")
    return (table(["model", *keys, "T", "accuracy [95% CI]", "n", "follow-up [95% CI]", "n"],
                  rows, numeric_from=1 + len(keys))
            + f'<p class="note">{esc(note)}</p>')


# -- plot 3 ----------------------------------------------------------------------------------------
def labels_plot(report: Report) -> str:
    bars = charts.label_bars(report)
    intro = ("What the generated user turns are: the share of each label per model, "
             "temperature and perturbation (each bar is all turns of its row; greys have no "
             "label). Hover a segment for its count.")
    if not bars:
        return section("labels", "Label distribution", intro,
                        '<p class="empty">No user turns in this run.</p>')
    svg = plots.stacked_bars(bars, categories(report.rows))
    return section("labels", "Label distribution", intro, f"<figure>{svg}</figure>")


# -- plot 4 ----------------------------------------------------------------------------------------
def perturbations(report: Report) -> str:
    left_out = "".join(f'<p class="note warn-note">{esc(line)}</p>'
                       for line in _unapplied_lines(report))
    if not report.comparisons:
        return section("perturbations", "Perturbations: paired differences",
                       "No perturbed context was generated.", left_out) if left_out else ""
    svg = plots.forest(charts.forest_rows(report), x_label=charts.FOREST_X_LABEL)
    intro = ("Each perturbation of the assistant answer is paired with the original context of "
             "the same items: the difference in follow-up rate (perturbed minus original) with a "
             "95% paired interval over shared items (clustered by item). Every perturbation is expected to "
             "raise the rate (a model that reads the conversation reacts to the change). For "
             "greedy decoding (one turn per item) McNemar's exact p is given too.")
    return section("perturbations", "Perturbations: paired differences", intro,
                    left_out + f"<figure>{svg}</figure>"
                    + _effects_table(report, charts.sorted_effects(report)))


def _unapplied_lines(report: Report) -> list[str]:
    """One line per perturbation that left items out: how many, of which condition, and why."""
    return [u.line(report.condition(u.model, u.answerer, u.dataset)) + "."
            for u in report.unapplied]


def user_variants(report: Report) -> str:
    """Each user-turn opening (prefill, system, template, warm-up) against the native one, paired
    over the items both hold."""
    if not report.variants:
        return ""
    intro = ("The user turn's opening as a factor: each variant is a condition of its own, paired "
             "with the native opening of the same model on the same items: the difference in "
             "follow-up rate (variant minus native) with a 95% paired interval clustered by item.")
    headers = ["model", "variant", "dataset", "perturbation", "T", "items", "native [95% CI]",
               "variant [95% CI]", "difference, pp [95% CI]"]
    rows = []
    for v in report.variants:
        d = v.follow_up
        rows.append([esc(v.native), f"<code>{esc(v.variant)}</code>", esc(v.dataset),
                     esc(v.perturbation), temperature(v.temperature), str(d.items),
                     _rate_n(d.a), _rate_n(d.b), _difference_cell(d)])
    return section("user-variants", "User-turn openings vs native", intro,
                   table(headers, rows, numeric_from=4))


_MARKS = {"expected": "yes", "expected_ns": "yes, n.s.", "opposite_ns": "no, n.s.",
          "opposite": "no, opposite", "none": "no change"}


def _effects_table(report: Report, cs: Sequence[PerturbationEffect]) -> str:
    headers = ["perturbation", "T", "items", "original [95% CI]", "perturbed [95% CI]",
               "difference, pp [95% CI]", "as expected?", "McNemar p", "dropped"]
    rows = []
    for c in cs:
        d, m = c.diff, c.mcnemar
        arrow = "↑" if c.expected == "up" else "↓"
        rows.append([esc(c.perturbation), temperature(c.temperature), str(d.items),
                     _rate_n(d.a), _rate_n(d.b), _difference_cell(d),
                     f'<span class="verdict {c.verdict}">{arrow} {_MARKS[c.verdict]}</span>',
                     _mcnemar_cell(m),
                     f"{d.dropped_a} / {d.dropped_b}"])
    note = ("↑: the rate is expected to rise; n.s.: the interval includes 0. McNemar (greedy "
            "only, one turn per item): exact p, with the items that switched to a follow-up (↑) "
            "and away from one (↓). dropped: items with turns on the original / perturbed side "
            "only (a perturbation that does not apply to an item, e.g. no number to change).")
    headings = [report.condition(c.probed, c.answerer, c.dataset) for c in cs]
    return (table(headers, rows, numeric_from=1, headings=headings, cls="grouped")
            + f'<p class="note">{esc(note)}</p>')


def _difference_cell(d: Difference) -> str:
    """A paired difference in points with its interval, as the perturbation and variant tables
    show it."""
    return (f'<span class="v">{points(d.delta, True)}</span> <span class="ci">'
            f'[{points(d.low, True)}, {points(d.high, True)}]</span>')


def _mcnemar_cell(m: McNemar | None) -> str:
    if m is None:
        return "–"
    return f"{p_value(m.p_value)} <span class='ci'>({m.b01}↑ {m.b10}↓)</span>"


def _rate_n(rate: Rate) -> str:
    return f'{rate_html(rate)} <span class="ci">n={rate.n}</span>'


# -- the continuation arm --------------------------------------------------------------------------
def arms(report: Report) -> str:
    """The continuation arm beside the opened one: the rates forced (opened) and unforced side by
    side, paired over items, and the next-role probabilities per model as bars. Empty for a run
    of the opened arm alone."""
    rows = arm_rows(report.turns)
    if not rows:
        return ""
    intro = ("The continuation arm does not hand the model the user's seat: the conversation "
             "ends as the template ends a past turn and the model goes on. Unforced: follow-ups "
             "over every continuation (one that had another role speak is no follow-up); of user "
             "turns: over those it wrote; opened: the probe's own rate on the same items, and the "
             "difference paired over items. 95% intervals clustered by item (docs/arms.md).")
    headers = ["model", "dataset", "T", "n", "opens a user turn", "unforced follow-up",
               "of user turns written", "opened arm", "unforced − opened, pp"]
    body = [[esc(r.condition.probed), esc(r.condition.dataset),
             temperature(r.condition.temperature), str(r.continuations),
             rate_html(r.opens_user), rate_html(r.unforced),
             rate_html(r.written) if r.written else "–",
             rate_html(r.opened) if r.opened else "–",
             _difference_cell(r.difference) if r.difference else "–"] for r in rows]
    names = {"user": "user header", "assistant": "assistant header", "end": "end of sequence",
             "other": "anything else"}
    bars = [plots.Bar(r.condition.probed, f"{r.condition.dataset} · "
                      f"{temperature(r.condition.temperature)}", r.next_role)
            for r in rows if r.next_role]
    svg = plots.stacked_bars(
        bars, list(names.items()), colours=plots.ROLE_COLOURS, counted=False,
        axis="Mean probability of what comes next after the closed conversation",
        title="Next-role probabilities") if bars else ""
    figure = f"<figure>{svg}</figure>" if svg else ""
    firsts = "; ".join(f"{esc(r.condition.probed)} T={temperature(r.condition.temperature)}: "
                       + ", ".join(f"{role} {n}" for role, n in r.roles.items()) for r in rows)
    return section("arms", "Who speaks next", intro,
                   table(headers, body, numeric_from=2,
                         groups=group_starts([r.condition.probed for r in rows]))
                   + f'<p class="note">What the continuations opened first: {firsts}.</p>'
                   + figure)


# -- joint table -----------------------------------------------------------------------------------
def right_wrong(report: Report) -> str:
    intro = ("Does the model follow up more when its answer was wrong? The follow-up rate of "
             "the turns after a right answer vs after a wrong one (unperturbed contexts), "
             "clustered by item. The two rates come from different items: compare their "
             "intervals, not a paired difference.")
    if not report.joints:
        return section("right-wrong", "Right vs wrong answers", intro,
                        '<p class="empty">No scored assistant answers in this run.</p>')
    keys = [k for k in ("answerer", "dataset") if report.varies(k)]
    headers = ["model", *keys, "T", "after a right answer [95% CI]", "turns", "items",
               "after a wrong answer [95% CI]", "turns", "items", "items in both"]
    rows = [[esc(c.probed), *(esc(getattr(c, k)) for k in keys), temperature_axis(c.temperature),
             rate_html(j.correct), str(j.correct.n), str(j.items_correct),
             rate_html(j.wrong), str(j.wrong.n), str(j.items_wrong), str(j.items_mixed)]
            for c, j in report.joints]
    return section("right-wrong", "Right vs wrong answers", intro,
                    table(headers, rows, numeric_from=1 + len(keys),
                           groups=group_starts([c.probed for c, _ in report.joints])))


# -- samples and export ----------------------------------------------------------------------------
def samples() -> str:
    selects = "".join(f'<label>{name}<select id="f-{field}" data-field="{field}"></select></label>'
                      for field, name in (("model", "Model"), ("arm", "Arm"),
                                          ("answerer", "Answerer"),
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
    return section("samples", "Samples", intro, body)


def export(links: Sequence[str]) -> str:
    if not links:
        body = ('<p class="note">Every table of this report can be written as CSV (and Parquet) '
                'with <code>userturn.report.export_tables(report, folder)</code>.</p>')
    else:
        body = "<ul class='files'>" + "".join(f'<li><a href="{esc(link)}">{esc(link)}</a></li>'
                                              for link in links) + "</ul>"
    return section("export", "Export", "The tables of this report as files.", body)


# -- agreement -------------------------------------------------------------------------------------
def agreement(report: Report) -> str:
    """Every pair of label sources that labelled the same turns (kappa, AC1, PABAK, the constant
    baseline), each labeller against the people, and each judge's labels and invalid rate."""
    results = report.agreement
    judges = _judge_rows(report)
    if not results and not judges:
        return ""
    body = ""
    if results:
        rows = [[esc(r.a), esc(r.b), str(r.n), _kappa(r.kappa, r.low, r.high), decimal(r.ac1),
                 decimal(r.pabak), percent(r.raw), percent(r.baseline)] for r in results]
        body += table(["a (reference)", "b", "turns", "kappa [95% CI]", "AC1", "PABAK",
                       "agreement", "constant a"], rows, numeric_from=2)
    people = report.against_people
    if people:
        rows = [[esc(p.labeller), esc(p.human), str(p.n), decimal(p.kappa),
                 "–" if p.in_range is None else
                 f"{decimal(p.human_low)} to {decimal(p.human_high)}",
                 "–" if p.in_range is None else ("yes" if p.in_range else "no")]
                for p in people]
        body += table(["labeller", "human", "turns", "kappa", "human vs human kappa",
                       "as good as a person"], rows, numeric_from=2)
    if judges:
        body += table(["judge", "turns judged", *(esc(label_header(x)) for x in LABELS),
                       "errors"], judges, numeric_from=1)
    intro = ("How far each label source can be trusted: kappa with a 95% interval bootstrapped "
             "over items, and, because follow-ups are rare under greedy decoding (where kappa "
             "misleads), Gwet's AC1, PABAK and the agreement of always giving the reference's "
             "most common label. A labeller is as good as a person when its kappa against a "
             "person is within the people's own range (docs/statistics.md).")
    return section("agreement", "Agreement between labellers", intro, body)


def _kappa(kappa: float, low: float, high: float) -> str:
    if kappa != kappa:
        return "–"
    return decimal(kappa) + ("" if low != low else f" [{decimal(low)}, {decimal(high)}]")


def _judge_rows(report: Report) -> list[list[str]]:
    """Per judge source: turns judged, the label distribution, and the failed verdicts."""
    counts: dict[str, dict[str, int]] = {}
    for turn in report.turns:
        for stored in turn.labels:
            if stored.source.startswith("judge:"):
                row = counts.setdefault(stored.source, {})
                key = stored.label or (VERDICT_ERROR if stored.error else "undecided")
                row[key] = row.get(key, 0) + 1
    rows = []
    for source, row in sorted(counts.items()):
        total = sum(row.values())
        rows.append([esc(source), str(total), *(str(row.get(label, 0)) for label in LABELS),
                     f"{row.get(VERDICT_ERROR, 0)} "
                     f"({percent(row.get(VERDICT_ERROR, 0) / total)})"])
    return rows
