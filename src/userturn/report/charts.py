"""What each plot of the report shows, as plain values: the HTML page draws them as inline SVG
(:mod:`.plots`) and ``userturn report --figures`` as PDF and PNG (:mod:`.figures`), so both show
the same points, bars and intervals."""

from __future__ import annotations

import math
from collections import defaultdict

from userturn.report import plots
from userturn.report.compute import Report
from userturn.report.numbers import p_value, percent, points, temperature_axis, temperature_label
from userturn.stats.effects import Panel, PerturbationEffect
from userturn.stats.summary import SummaryRow

RATE_X_LABEL, RATE_Y_LABEL = "Sampling temperature", "Genuine follow-up rate"
FOREST_X_LABEL = "Perturbed minus original follow-up rate (percentage points)"


def model_index(report: Report, model: str) -> int:
    return report.models.index(model) if model in report.models else len(report.models)


# -- plot 1: follow-up rate vs temperature --------------------------------------------------------
def temperature_series(report: Report) -> list[plots.Series]:
    """One line per model (and answerer, dataset) over the unperturbed contexts."""
    groups: dict[tuple[str, str, str], list[SummaryRow]] = defaultdict(list)
    for r in report.rows:
        if r.perturbation == "none":
            groups[(r.probed, r.answerer, r.dataset)].append(r)
    order = sorted(groups, key=lambda k: (model_index(report, k[0]), k[1] != "self", k[1:]))
    return [plots.Series(report.condition(*key), plots.model_colour(i), [
        plots.Point(r.temperature, r.follow_up.value, r.follow_up.low, r.follow_up.high,
                    f"{report.condition(*key)}, T = {temperature_axis(r.temperature)}: "
                    f"{percent(r.follow_up.value)} [{points(r.follow_up.low)}–"
                    f"{points(r.follow_up.high)}], n = {r.follow_up.n}")
        for r in sorted(groups[key], key=lambda r: r.temperature) if r.follow_up.n])
        for i, key in enumerate(order)]


# -- plot 2: task accuracy vs follow-up rate ------------------------------------------------------
def panel_title(report: Report, panel: Panel) -> str:
    title = f"T = {temperature_axis(panel.temperature)}"
    return f"{panel.dataset} · {title}" if report.varies("dataset") else title


def rho_note(panel: Panel) -> str:
    c = panel.correlation
    if c.n < 3:
        return f"{c.n} model{'s' if c.n != 1 else ''}: too few for Spearman ρ (needs ≥ 3)"
    if not math.isfinite(c.rho):
        return f"Spearman ρ undefined: one side is constant ({c.n} models)"
    interval = "" if not math.isfinite(c.low) else f" [{c.low:+.2f}, {c.high:+.2f}]"
    return f"Spearman ρ = {c.rho:+.2f}{interval}, {c.n} models"


def too_few_to_plot(report: Report) -> bool:
    """One model in every panel: a panel would be one dot under "too few for Spearman", so the
    page shows the numbers as a table and ``--figures`` leaves the plot out."""
    return max((len(p.points) for p in report.panels), default=0) < 2


def panel_dots(report: Report, panel: Panel) -> list[plots.Dot]:
    return [plots.Dot(model, plots.model_colour(model_index(report, model)), acc.value,
                      acc.low, acc.high, rate.value, rate.low, rate.high,
                      f"{model}: accuracy {percent(acc.value)} [{points(acc.low)}–"
                      f"{points(acc.high)}] n = {acc.n}; follow-up {percent(rate.value)} "
                      f"[{points(rate.low)}–{points(rate.high)}] n = {rate.n}")
            for model, acc, rate in panel.points]


def panel_scale(report: Report) -> tuple[float, float]:
    """The shared y axis of the panels: its top and tick step."""
    highs = [rate.high for p in report.panels for _, _, rate in p.points]
    return plots.nice_top(max([h for h in highs if math.isfinite(h)] or [0.1]))


# -- plot 3: label distribution -------------------------------------------------------------------
def label_bars(report: Report) -> list[plots.Bar]:
    rows = sorted(report.rows, key=lambda r: (model_index(report, r.probed), r.answerer,
                                              r.dataset, r.temperature, r.arm != "opened",
                                              r.perturbation != "none", r.perturbation))
    arms = any(r.arm != "opened" for r in report.rows)
    return [plots.Bar(report.condition(r.probed, r.answerer, r.dataset),
                      temperature_label(r.temperature) + (f" · {r.arm}" if arms else "") + (
                          f" · {r.perturbation}" if report.varies("perturbation") else ""),
                      r.status_counts()) for r in rows]


# -- plot 4: perturbation effects -----------------------------------------------------------------
def sorted_effects(report: Report) -> list[PerturbationEffect]:
    return sorted(report.comparisons, key=lambda c: (model_index(report, c.probed), c.answerer,
                                                     c.dataset, c.perturbation, c.temperature))


def forest_rows(report: Report) -> list[plots.ForestRow]:
    return [plots.ForestRow(report.condition(c.probed, c.answerer, c.dataset),
                            f"{c.perturbation} · {temperature_label(c.temperature)}",
                            c.diff.delta, c.diff.low, c.diff.high, c.verdict, _forest_note(c),
                            _forest_tip(c))
            for c in sorted_effects(report)]


def _forest_note(c: PerturbationEffect) -> str:
    d = c.diff
    if not d.items:
        return "no shared items"
    text = (f"{points(d.delta, True)} [{points(d.low, True)}, {points(d.high, True)}] pp · "
            f"{d.items} items")
    return text + (f" · p = {p_value(c.mcnemar.p_value)}" if c.mcnemar else "")


def _forest_tip(c: PerturbationEffect) -> str:
    d = c.diff
    return (f"{c.probed} · {c.perturbation} · T = {temperature_axis(c.temperature)}: original "
            f"{percent(d.a.value)} (n = {d.a.n}), perturbed {percent(d.b.value)} "
            f"(n = {d.b.n}); {plots.VERDICTS[c.verdict][0]}")
