"""The report's plots as figures for a paper: ``userturn report RUN --figures DIR``.

Each plot of the HTML report is drawn with matplotlib (the optional extra ``figures``) from the
same values (:mod:`.charts`) and written as PDF (vector, fonts embedded as TrueType) and PNG
(300 dpi). Sizes fit a two-column paper: 3.3 inches wide for one column, 6.9 for both; 8 pt text.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from userturn.errors import UserturnError
from userturn.report import charts, plots
from userturn.report.compute import Report, categories
from userturn.report.numbers import temperature_axis

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLUMN, PAGE = 3.3, 6.9  # inches: one column and the full text width of a two-column paper
STYLE: dict[str, Any] = {"font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8, "legend.fontsize": 7,
         "xtick.labelsize": 7, "ytick.labelsize": 7, "axes.spines.top": False,
         "axes.spines.right": False, "axes.linewidth": 0.6, "lines.linewidth": 1.2,
         "pdf.fonttype": 42, "ps.fonttype": 42, "savefig.bbox": "tight",
         "savefig.pad_inches": 0.02}


def check_figures_folder(folder: Path) -> Path:
    """``folder`` if figures can go there (a folder, or nothing yet): checked before the report
    prints anything, so a wrong --figures is one line, not tables and then a traceback."""
    folder = Path(folder)
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise UserturnError(f"--figures {folder}: {existing} is a file, not a folder")
    return folder


def write_figures(report: Report, folder: Path) -> list[Path]:
    """Write every plot the report has data for into ``folder`` as NAME.pdf and NAME.png;
    returns the paths written (a plot without data is left out, as on the page)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserturnError("--figures needs matplotlib: pip install 'userturn[figures]'") from None
    folder = check_figures_folder(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserturnError(f"--figures {folder}: cannot make the folder ({exc.strerror})") \
            from None
    drawers: dict[str, Callable[[Report, Any], Figure | None]] = {
        "follow_up_vs_temperature": _temperature, "accuracy_vs_follow_up": _accuracy,
        "labels": _labels, "perturbations": _perturbations}
    written = []
    with plt.rc_context(STYLE):  # type: ignore[arg-type]  # rc keys are a Literal set
        for name, draw in drawers.items():
            figure = draw(report, plt)
            if figure is None:
                continue
            for suffix, dpi in ((".pdf", "figure"), (".png", 300)):
                path = folder / f"{name}{suffix}"
                figure.savefig(path, dpi=dpi)
                written.append(path)
            plt.close(figure)
    return written


def _clear_of_the_axes(ax: Any) -> None:
    """Move the axis lines a few points out, so a point or interval at 0% is drawn beside the
    axis, not under it (an interval at 0% accuracy was hidden by the y axis)."""
    for side in ("left", "bottom"):
        ax.spines[side].set_position(("outward", 4))


def _percent_axis(axis: Any) -> None:
    from matplotlib.ticker import PercentFormatter

    axis.set_major_formatter(PercentFormatter(1.0, decimals=0))


def _temperature(report: Report, plt: Any) -> Figure | None:
    series = [s for s in charts.temperature_series(report) if s.points]
    if not series:
        return None
    figure, ax = plt.subplots(figsize=(COLUMN, 2.2))
    for s in series:
        xs = [p.x for p in s.points]
        ax.fill_between(xs, [p.low for p in s.points], [p.high for p in s.points],
                        color=s.colour, alpha=0.15, linewidth=0)
        ax.plot(xs, [p.y for p in s.points], marker="o", markersize=3, color=s.colour,
                label=s.name)
    ticks = sorted({p.x for s in series for p in s.points})
    ax.set_xticks(ticks, [temperature_axis(t) for t in ticks])
    ax.set_xlabel(charts.RATE_X_LABEL)
    ax.set_ylabel(charts.RATE_Y_LABEL)
    ax.set_ylim(bottom=0)
    _clear_of_the_axes(ax)
    _percent_axis(ax.yaxis)
    ax.legend(frameon=False, loc="best")
    return figure


def _accuracy(report: Report, plt: Any) -> Figure | None:
    panels = [p for p in report.panels if p.points]
    if not panels or charts.too_few_to_plot(report):
        return None
    y_top, _ = charts.panel_scale(report)
    width = COLUMN if len(panels) == 1 else PAGE
    figure, axes = plt.subplots(1, len(panels), figsize=(width, 2.2), sharey=True,
                                squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for dot in charts.panel_dots(report, panel):
            if not (math.isfinite(dot.x) and math.isfinite(dot.y)):
                continue
            ax.errorbar(dot.x, dot.y, xerr=[[dot.x - dot.x_low], [dot.x_high - dot.x]],
                        yerr=[[dot.y - dot.y_low], [dot.y_high - dot.y]], fmt="o",
                        markersize=3.5, color=dot.colour, elinewidth=0.8, label=dot.name,
                        clip_on=False)  # an interval at 0% or 100% shows whole
        ax.set_title(f"{charts.panel_title(report, panel)}\n{charts.rho_note(panel)}")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, y_top)
        ax.set_xlabel("Task accuracy")
        _clear_of_the_axes(ax)
        _percent_axis(ax.xaxis)
        _percent_axis(ax.yaxis)
    axes[0][0].set_ylabel("Follow-up rate")
    axes[0][0].legend(frameon=False, loc="best")
    return figure


def _labels(report: Report, plt: Any) -> Figure | None:
    bars = charts.label_bars(report)
    if not bars:
        return None
    figure, ax = plt.subplots(figsize=(PAGE, 0.6 + 0.22 * len(bars)))
    names = [f"{b.group} · {b.name}" for b in bars]
    left = [0.0] * len(bars)
    for key, name in categories(report.rows):
        shares = [b.counts.get(key, 0) / (sum(b.counts.values()) or 1) for b in bars]
        if not any(shares):
            continue
        ax.barh(names, shares, left=left, color=plots.LABEL_COLOURS[key], label=name,
                edgecolor="white", linewidth=0.3)
        left = [a + b for a, b in zip(left, shares)]
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("Share of generated user turns")
    _percent_axis(ax.xaxis)
    ax.legend(frameon=False, ncol=5, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    return figure


def _perturbations(report: Report, plt: Any) -> Figure | None:
    rows = [r for r in charts.forest_rows(report) if math.isfinite(r.delta)]
    if not rows:
        return None
    figure, ax = plt.subplots(figsize=(COLUMN, 0.6 + 0.22 * len(rows)))
    for i, row in enumerate(rows):
        _, colour, filled = plots.VERDICTS[row.verdict]
        ax.plot([row.low, row.high], [i, i], color=colour, linewidth=1.2)
        ax.plot([row.delta], [i], marker="o", markersize=4, color=colour,
                markerfacecolor=colour if filled else "white")
    ax.axvline(0, color="#222", linewidth=0.7, linestyle="--")
    ax.set_yticks(range(len(rows)), [f"{r.group} · {r.name}" for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("Perturbed minus original follow-up rate (pp)")
    ax.xaxis.set_major_formatter(lambda value, _: f"{100 * value:+.0f}" if value else "0")
    return figure
