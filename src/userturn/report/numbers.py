"""How numbers and labels are written in tables, pages and plots: every format lives here, so a
rate, a temperature or a label reads the same in the terminal, the HTML report and compare.

Missing values (None or NaN) are written as ``missing``: "-" in the terminal, "–" on pages.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from userturn.taxonomy import TAXONOMY

if TYPE_CHECKING:
    from userturn.stats.rates import Difference, Rate

# Short column names of the labels, for narrow tables, in the taxonomy's order.
LABEL_HEADERS = TAXONOMY.headers


def label_header(label: str) -> str:
    return LABEL_HEADERS.get(label, label)


def _missing(value: float | None) -> bool:
    return value is None or not math.isfinite(value)


def percent(value: float | None, digits: int = 0, missing: str = "–") -> str:
    """A fraction as a percentage: 0.125 -> "12%" (digits 0) or "12.5%" (digits 1)."""
    return missing if _missing(value) else f"{100 * value:.{digits}f}%"  # type: ignore[operator]


def points(value: float | None, sign: bool = False) -> str:
    """A fraction in percentage points without the unit: 0.12 -> "12"; with ``sign`` "+12" and
    a typographic minus."""
    if _missing(value):
        return "–"
    return f"{100 * value:+.0f}".replace("-", "−") if sign else f"{100 * value:.0f}"  # type: ignore[operator]


def rate_interval(rate: Rate | None) -> str:
    """A rate with its interval for the terminal: "12% [5-20]", "-" when it has no turns."""
    if rate is None or rate.n == 0:
        return "-"
    return interval_text(rate.value, rate.low, rate.high)


def interval_text(value: float, low: float, high: float) -> str:
    """"12% [5-20]"; a narrow interval gets decimals ("0% [0-0.4]"), so a finite sample's
    interval never reads as the zero-width "0% [0-0]"."""
    digits = interval_digits(low, high)
    return f"{100 * value:.{digits}f}% [{100 * low:.{digits}f}-{100 * high:.{digits}f}]"


def interval_digits(low: float, high: float) -> int:
    """Decimals of a percentage interval: enough that a positive width stays visible."""
    width = 100 * (high - low)
    return 0 if width >= 5 else 1 if width >= 0.5 else 2


def difference(d: Difference) -> str:
    """A paired difference in points with its interval: "+4.0 pts [-2.0, +9.5]"."""
    if _missing(d.delta):
        return "-"
    return f"{100 * d.delta:+.1f} pts [{100 * d.low:+.1f}, {100 * d.high:+.1f}]"


def p_value(value: float) -> str:
    return "<0.001" if value < 0.001 else f"{value:.3f}" if value < 0.1 else f"{value:.2f}"


def decimal(value: float | None, digits: int = 2) -> str:
    return "-" if _missing(value) else f"{value:.{digits}f}"


def f1(value: float | None) -> str:
    return "-" if value is None else f"F1 {value:.2f}"


def temperature(value: float) -> str:
    """A table cell: "greedy" or "0.7"."""
    return "greedy" if value <= 0 else f"{value:g}"


def temperature_label(value: float) -> str:
    """A row or series name: "greedy" or "T = 0.7"."""
    return "greedy" if value <= 0 else f"T = {value:g}"


def temperature_axis(value: float) -> str:
    """An axis tick or a value after "T = ": "0 (greedy)" or "0.7"."""
    return "0 (greedy)" if value <= 0 else f"{value:g}"
