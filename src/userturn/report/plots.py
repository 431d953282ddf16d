"""Inline SVG plots for the HTML report: no plotting library, no network, plain strings.

Every function takes plain values (names, rates, intervals) and returns one ``<svg>`` element.
All text is escaped here; tooltips are SVG ``<title>`` elements. Rates are fractions in [0, 1];
intervals are ``(low, high)`` fractions. Colours come from two fixed palettes, so a label or a
model has the same colour in every plot of a report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape
from typing import Mapping, Sequence

from userturn.report.numbers import percent, temperature_axis
from userturn.taxonomy import TAXONOMY

MODEL_COLOURS = ("#3b6ea8", "#d4803a", "#4c956c", "#b5464b", "#7a68a6", "#8c6d53", "#c5719d",
                 "#6b7b8c", "#a89a3c", "#4aa3b5")
# The labels' colours from the taxonomy (Okabe-Ito hues, colour-blind safe), then greys for
# turns without a label.
LABEL_COLOURS = {**TAXONOMY.colours, "undecided": "#d9d9d9", "error": "#9a9a9a",
                 "failed": "#4d4d4d", "no user turn": "#f2f2f2"}
INK, MUTED, GRID = "#222", "#666", "#e6e6e6"
UP, DOWN, FLAT = "#1b7f6b", "#c0504d", "#888"
CHAR = 7.0  # average glyph width at 12.5px, for laying out text without measuring it


def model_colour(index: int) -> str:
    return MODEL_COLOURS[index % len(MODEL_COLOURS)]


def text_colour(background: str) -> str:
    """Dark or white text, whichever reads better on ``background`` (#rrggbb)."""
    r, g, b = (int(background[i:i + 2], 16) for i in (1, 3, 5))
    return INK if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "#fff"


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _f(value: float) -> str:
    return f"{value:.1f}"


def _text(x: float, y: float, body: str, *, anchor: str = "start", size: float = 12.5,
          fill: str = INK, weight: str = "normal", extra: str = "") -> str:
    return (f'<text x="{_f(x)}" y="{_f(y)}" text-anchor="{anchor}" font-size="{size}" '
            f'fill="{fill}" font-weight="{weight}"{extra}>{_e(body)}</text>')


def _line(x1: float, y1: float, x2: float, y2: float, stroke: str, width: float = 1,
          extra: str = "") -> str:
    return (f'<line x1="{_f(x1)}" y1="{_f(y1)}" x2="{_f(x2)}" y2="{_f(y2)}" stroke="{stroke}" '
            f'stroke-width="{width}"{extra}/>')


def _svg(width: float, height: float, body: list[str], label: str, cls: str) -> str:
    return (f'<svg class="plot {cls}" xmlns="http://www.w3.org/2000/svg" role="img" '
            f'aria-label="{_e(label)}" width="{_f(width)}" height="{_f(height)}" '
            f'viewBox="0 0 {_f(width)} {_f(height)}">' + "".join(body) + "</svg>")


def shorten(name: str, limit: int) -> str:
    return name if len(name) <= limit else name[:limit - 1] + "…"


def nice_top(value: float, *, ceiling: float = 1.0) -> tuple[float, float]:
    """An axis top above ``value`` and a tick step that divides it into at most six steps."""
    value = max(value, 0.01) if math.isfinite(value) else ceiling
    for step in (0.01, 0.02, 0.05, 0.1, 0.2, 0.25):
        top = math.ceil(value / step - 1e-9) * step
        if top / step <= 6:
            return min(top, ceiling), step
    return ceiling, 0.2


def _finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


# -- plot 1: rate vs temperature -------------------------------------------------------------------
@dataclass(frozen=True)
class Point:
    x: float
    y: float
    low: float
    high: float
    tip: str = ""


@dataclass(frozen=True)
class Series:
    name: str
    colour: str
    points: list[Point] = field(default_factory=list)


def rate_lines(series: Sequence[Series], *, x_label: str, y_label: str) -> str:
    """Lines with shaded 95% interval bands, one per series, and a legend on the right."""
    width, height, left, right, top, bottom = 900, 420, 70, 230, 24, 64
    pw, ph = width - left - right, height - top - bottom
    xs = sorted({p.x for s in series for p in s.points}) or [0.0]
    span = (xs[-1] - xs[0]) or 1.0
    x0, x1 = xs[0] - 0.06 * span, xs[-1] + 0.06 * span
    y_top, step = nice_top(max(_finite([p.high for s in series for p in s.points]) or [0.1]))
    sx = lambda x: left + (x - x0) / (x1 - x0) * pw  # noqa: E731
    sy = lambda y: top + ph - (y / y_top) * ph  # noqa: E731
    body = _y_grid(sy, y_top, step, left, left + pw)
    for x in xs:
        tick = temperature_axis(x)
        body.append(_line(sx(x), top + ph, sx(x), top + ph + 5, MUTED))
        body.append(_text(sx(x), top + ph + 20, tick, anchor="middle", fill=MUTED))
    body.append(_line(left, top + ph, left + pw, top + ph, MUTED))
    body.append(_text(left + pw / 2, height - 14, x_label, anchor="middle", weight="600"))
    body.append(_text(18, top + ph / 2, y_label, anchor="middle", weight="600",
                      extra=f' transform="rotate(-90 18 {_f(top + ph / 2)})"'))
    for i, s in enumerate(series):
        dodge = (i - (len(series) - 1) / 2) * 3.0  # overlapping series stay visible
        body.extend(_series(s, lambda x, d=dodge: sx(x) + d, sy))
    body.extend(_line_legend(series, left + pw + 24, top + 6))
    return _svg(width, height, body, f"{y_label} against {x_label}", "lines")


def _y_grid(sy, y_top: float, step: float, x_from: float, x_to: float) -> list[str]:
    out = []
    for k in range(int(round(y_top / step)) + 1):
        y = k * step
        out.append(_line(x_from, sy(y), x_to, sy(y), GRID))
        out.append(_text(x_from - 8, sy(y) + 4, percent(y), anchor="end", fill=MUTED))
    return out


def _series(s: Series, sx, sy) -> list[str]:
    points = [p for p in s.points if math.isfinite(p.y)]
    if not points:
        return []
    band = [(sx(p.x), sy(p.high)) for p in points] + [(sx(p.x), sy(p.low))
                                                      for p in reversed(points)]
    out = []
    if len(points) > 1:
        coords = " ".join(f"{_f(x)},{_f(y)}" for x, y in band)
        out.append(f'<polygon points="{coords}" fill="{s.colour}" fill-opacity="0.13" '
                   f'stroke="none"/>')
        line = " ".join(f"{_f(sx(p.x))},{_f(sy(p.y))}" for p in points)
        out.append(f'<polyline points="{line}" fill="none" stroke="{s.colour}" '
                   f'stroke-width="2.2" stroke-linejoin="round"/>')
    else:
        p = points[0]
        out.append(_line(sx(p.x), sy(p.low), sx(p.x), sy(p.high), s.colour, 1.5))
    for p in points:
        out.append(f'<circle cx="{_f(sx(p.x))}" cy="{_f(sy(p.y))}" r="4.5" fill="{s.colour}" '
                   f'stroke="#fff" stroke-width="1.5"><title>{_e(p.tip)}</title></circle>')
    return out


def _line_legend(series: Sequence[Series], x: float, y: float) -> list[str]:
    out = [_text(x, y + 4, "95% interval: shaded", size=11.5, fill=MUTED)]
    for i, s in enumerate(series):
        row = y + 24 + 22 * i
        out.append(_line(x, row, x + 22, row, s.colour, 2.2))
        out.append(f'<circle cx="{_f(x + 11)}" cy="{_f(row)}" r="4" fill="{s.colour}"/>')
        out.append(_text(x + 30, row + 4, shorten(s.name, 28),
                         extra=f' data-name="{_e(s.name)}"'))
    return out


# -- plot 2: accuracy vs rate, one panel per condition ---------------------------------------------
@dataclass(frozen=True)
class Dot:
    name: str
    colour: str
    x: float
    x_low: float
    x_high: float
    y: float
    y_low: float
    y_high: float
    tip: str = ""


def scatter_panel(title: str, note: str, dots: Sequence[Dot], *, y_top: float, step: float,
                  x_label: str, y_label: str) -> str:
    """One panel: points with error bars both ways; x fixed to [0, 1], y to [0, y_top]."""
    width, height, left, right, top, bottom = 350, 330, 62, 18, 52, 56
    pw, ph = width - left - right, height - top - bottom
    sx = lambda x: left + x * pw  # noqa: E731
    sy = lambda y: top + ph - (y / y_top) * ph  # noqa: E731
    body = [_text(left, 18, title, weight="600", size=13.5), _text(left, 36, note, size=11.5,
                                                                   fill=MUTED)]
    body += _y_grid(sy, y_top, step, left, left + pw)
    for k in range(5):
        x = k / 4
        body.append(_line(sx(x), top, sx(x), top + ph, GRID))
        body.append(_text(sx(x), top + ph + 18, percent(x), anchor="middle", fill=MUTED))
    body.append(_line(left, top + ph, left + pw, top + ph, MUTED))
    body.append(_text(left + pw / 2, height - 12, x_label, anchor="middle", weight="600"))
    body.append(_text(16, top + ph / 2, y_label, anchor="middle", weight="600",
                      extra=f' transform="rotate(-90 16 {_f(top + ph / 2)})"'))
    for d in dots:
        if not (math.isfinite(d.x) and math.isfinite(d.y)):
            continue
        body.append(_line(sx(d.x_low), sy(d.y), sx(d.x_high), sy(d.y), d.colour, 1.4))
        body.append(_line(sx(d.x), sy(d.y_low), sx(d.x), sy(d.y_high), d.colour, 1.4))
        body.append(f'<circle cx="{_f(sx(d.x))}" cy="{_f(sy(d.y))}" r="5.5" fill="{d.colour}" '
                    f'stroke="#fff" stroke-width="1.5"><title>{_e(d.tip)}</title></circle>')
    return _svg(width, height, body, f"{title}: {y_label} against {x_label}", "scatter")


# -- plot 3: stacked label shares ------------------------------------------------------------------
@dataclass(frozen=True)
class Bar:
    group: str
    name: str
    counts: Mapping[str, float]  # counts of turns, or shares (stacked_bars(counted=False))


# The continuation arm's next-role probabilities: the user header in the follow-up's blue family,
# the assistant's in the drift colour's, the end of sequence grey, anything else pale.
ROLE_COLOURS = {"user": "#0072b2", "assistant": "#d55e00", "end": "#7f7f7f", "other": "#e6e6e6"}


def stacked_bars(bars: Sequence[Bar], categories: Sequence[tuple[str, str]], *,
                 colours: Mapping[str, str] | None = None,
                 axis: str = "Share of generated user turns",
                 title: str = "Label distribution of the generated user turns",
                 counted: bool = True) -> str:
    """Horizontal bars of shares (each bar sums to 100% of its turns), grouped under headings.
    ``categories``: (key, legend name) in stacking order; colours from ``colours`` (default
    LABEL_COLOURS). ``counted``: the bars hold counts (a segment's tip says how many of how
    many); else shares already (a segment's tip says its share)."""
    colours = colours or LABEL_COLOURS
    width, left, bar_w = 900, 290, 550
    legend, legend_h = _swatch_legend(categories, 8, 10, width - 16, colours)
    body, y, group = legend, 10 + legend_h + 12, None
    for bar in bars:
        if bar.group != group:
            group = bar.group
            y += 8 if body is not legend else 0
            body.append(_text(8, y + 14, shorten(group, 60), weight="600"))
            y += 22
        body.extend(_bar_row(bar, categories, y, left, bar_w, colours, counted))
        y += 24
    axis_y = y + 4
    for k in range(5):
        x = left + k / 4 * bar_w
        body.append(_line(x, axis_y, x, axis_y + 4, MUTED))
        body.append(_text(x, axis_y + 18, percent(k / 4), anchor="middle", fill=MUTED))
    body.append(_text(left + bar_w / 2, axis_y + 38, axis, anchor="middle", weight="600"))
    return _svg(width, axis_y + 48, body, title, "bars")


def _swatch_legend(categories: Sequence[tuple[str, str]], x0: float, y0: float,
                   room: float, colours: Mapping[str, str]) -> tuple[list[str], float]:
    out, x, y = [], x0, y0
    for key, name in categories:
        need = 22 + CHAR * len(name) + 18
        if x + need > x0 + room:
            x, y = x0, y + 22
        out.append(f'<rect x="{_f(x)}" y="{_f(y)}" width="14" height="14" rx="2" '
                   f'fill="{colours[key]}" stroke="#0002"/>')
        out.append(_text(x + 20, y + 12, name))
        x += need
    return out, y - y0 + 16


def _bar_row(bar: Bar, categories: Sequence[tuple[str, str]], y: float, left: float,
             bar_w: float, colours: Mapping[str, str], counted: bool) -> list[str]:
    total = sum(bar.counts.values())
    out = [_text(left - 10, y + 13, shorten(bar.name, 40), anchor="end")]
    x = left
    for key, name in categories:
        count = bar.counts.get(key, 0)
        if not count:
            continue
        w = count / total * bar_w
        colour = colours[key]
        tip = (f"{bar.group} · {bar.name}: {name} {count} of {total} ({percent(count / total)})"
               if counted else f"{bar.group} · {bar.name}: {name} {percent(count / total, 1)}")
        out.append(f'<rect x="{_f(x)}" y="{_f(y)}" width="{_f(w)}" height="18" fill="{colour}">'
                   f'<title>{_e(tip)}</title></rect>')
        if w >= 34:
            out.append(_text(x + w / 2, y + 13, percent(count / total), anchor="middle", size=11,
                             fill=text_colour(colour), extra=' pointer-events="none"'))
        x += w
    if not total:
        out.append(_text(left + 4, y + 13, "no turns", fill=MUTED))
    if counted:
        out.append(_text(left + bar_w + 8, y + 13, f"n={total}", fill=MUTED, size=11.5))
    return out


# -- plot 4: forest plot of paired differences -----------------------------------------------------
@dataclass(frozen=True)
class ForestRow:
    group: str
    name: str
    delta: float
    low: float
    high: float
    verdict: str  # "expected" | "expected_ns" | "opposite" | "opposite_ns" | "none"
    note: str  # right-hand text, e.g. "+12 pp [-3, +27] · p = 0.25"
    tip: str = ""


VERDICTS = {"expected": ("moved as expected, interval excludes 0", UP, True),
            "expected_ns": ("expected direction, interval includes 0", UP, False),
            "opposite_ns": ("opposite direction, interval includes 0", DOWN, False),
            "opposite": ("opposite direction, interval excludes 0", DOWN, True),
            "none": ("no change or no shared items", FLAT, False)}


def forest(rows: Sequence[ForestRow], *, x_label: str,
           legend: dict[str, str] | None = None) -> str:
    """Paired differences with intervals, a zero line, and a marker per expected direction.
    ``legend`` renames the verdicts (e.g. "B higher" for a comparison of two runs)."""
    width, left, plot_w, top = 980, 290, 380, 78
    bound = max([abs(v) for r in rows for v in (r.low, r.high, r.delta)
                 if math.isfinite(v)] or [0.1])
    span, step = nice_top(bound)
    sx = lambda v: left + (v + span) / (2 * span) * plot_w  # noqa: E731
    body = _forest_legend(10, legend or {})
    body.append(_text(sx(0) - 8, top - 12, "← fewer follow-ups", anchor="end", fill=MUTED,
                      size=11.5))
    body.append(_text(sx(0) + 8, top - 12, "more follow-ups →", fill=MUTED, size=11.5))
    y, group = top, None
    ys: list[float] = []
    for row in rows:
        if row.group != group:
            group = row.group
            y += 8 if ys else 0
            body.append(_text(8, y + 14, shorten(group, 60), weight="600"))
            y += 22
        ys.append(y)
        body.extend(_forest_row(row, y, sx, left, plot_w))
        y += 24
    for k in range(-round(span / step), round(span / step) + 1):
        v = k * step
        body.insert(0, _line(sx(v), top, sx(v), y, GRID))
        body.append(_text(sx(v), y + 18, f"{100 * v:+.0f}" if v else "0", anchor="middle",
                          fill=MUTED))
    body.append(_line(sx(0), top - 4, sx(0), y, INK, 1.2, ' stroke-dasharray="4 3"'))
    body.append(_text(sx(0), y + 40, x_label, anchor="middle", weight="600"))
    return _svg(width, y + 52, body, "Paired differences in follow-up rate", "forest")


def _forest_legend(y: float, names: dict[str, str]) -> list[str]:
    out = []
    for i, key in enumerate(("expected", "expected_ns", "opposite", "opposite_ns")):
        text, colour, filled = VERDICTS[key]
        text = names.get(key, text)
        x, row = 8 + (i % 2) * 330, y + (i // 2) * 20
        out.append(_marker(x + 7, row + 6, colour, filled))
        out.append(_text(x + 20, row + 10, text, size=11.5))
    return out


def _marker(cx: float, cy: float, colour: str, filled: bool, tip: str = "") -> str:
    title = f"<title>{_e(tip)}</title>" if tip else ""
    fill = colour if filled else "#fff"
    return (f'<circle cx="{_f(cx)}" cy="{_f(cy)}" r="5.5" fill="{fill}" stroke="{colour}" '
            f'stroke-width="2">{title}</circle>')


def _forest_row(row: ForestRow, y: float, sx, left: float, plot_w: float) -> list[str]:
    _, colour, filled = VERDICTS[row.verdict]
    mid = y + 9
    out = [_text(left - 12, mid + 4, shorten(row.name, 40), anchor="end")]
    if math.isfinite(row.delta):
        out.append(_line(sx(row.low), mid, sx(row.high), mid, colour, 2))
        for v in (row.low, row.high):
            out.append(_line(sx(v), mid - 4, sx(v), mid + 4, colour, 1.5))
        out.append(_marker(sx(row.delta), mid, colour, filled, row.tip))
    out.append(_text(left + plot_w + 14, mid + 4, row.note, size=11.5, fill=MUTED))
    return out
