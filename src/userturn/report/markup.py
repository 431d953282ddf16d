"""The building blocks of userturn's HTML pages: escaping, the JSON block, tables and sections.

Only run metadata and numbers are written into a page as HTML (escaped here); model-written text
travels in the JSON block and is shown by the page's script with ``textContent``.
"""

from __future__ import annotations

import json
import math
import re
import time
from html import escape
from typing import Any, Sequence

from userturn.report.numbers import interval_digits, percent
from userturn.stats.rates import Rate


def json_for_script(data: Any) -> str:
    """JSON that cannot end or re-open its ``<script>`` block: ``<``, ``>`` and ``&`` become
    unicode escapes (so ``</script>`` reads ``\\u003c/script\\u003e``), which JSON.parse undoes."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False)
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def fill(template: str, values: dict[str, str]) -> str:
    """Replace ``{{NAME}}`` placeholders in one pass (inserted text is never scanned again)."""
    return re.sub(r"\{\{([A-Z_]+)\}\}", lambda m: values[m.group(1)], template)


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def esc(value: Any) -> str:
    return escape(str(value), quote=True)


def rate_html(rate: Rate | None, value: float | None = None) -> str:
    """A rate and its interval; ``value`` replaces ``rate.value`` (an estimate that is not a
    count of hits, such as a corrected rate)."""
    if rate is None or rate.n == 0:
        return '<span class="na">–</span>'
    digits = interval_digits(rate.low, rate.high) if math.isfinite(rate.high - rate.low) else 0
    shown = rate.value if value is None else value
    return (f'<span class="v">{percent(shown, digits)}</span> '
            f'<span class="ci">[{100 * rate.low:.{digits}f}–{100 * rate.high:.{digits}f}]'
            '</span>')


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, numeric_from: int = 0,
          numeric: Sequence[bool] = (), cls: str = "", groups: Sequence[bool] = (),
          headings: Sequence[str] = ()) -> str:
    """An HTML table whose columns from ``numeric_from`` on hold numbers (right-aligned), or
    those ``numeric`` marks; ``groups`` marks rows that start a group (a rule above them),
    ``headings`` gives each row a group heading, shown as a row of its own when it changes."""
    numbers = list(numeric) or [i >= numeric_from for i in range(len(headers))]
    head = "".join(f'<th class="{"num" if numbers[i] else ""}">{h}</th>'
                   for i, h in enumerate(headers))
    body = []
    for r, cells in enumerate(rows):
        if headings and (r == 0 or headings[r] != headings[r - 1]):
            body.append(f'<tr class="heading"><th colspan="{len(headers)}">{esc(headings[r])}'
                        f"</th></tr>")
        tds = "".join(f'<td class="{"num" if numbers[i] else ""}">{c}</td>'
                      for i, c in enumerate(cells))
        first = ' class="group-start"' if groups and groups[r] else ""
        body.append(f"<tr{first}>{tds}</tr>")
    return (f'<div class="table-wrap"><table class="{cls}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def group_starts(keys: Sequence[Any]) -> list[bool]:
    return [i > 0 and keys[i] != keys[i - 1] for i in range(len(keys))]


def section(sid: str, title: str, intro: str, body: str) -> str:
    return (f'<section id="{sid}"><h2>{esc(title)}</h2><p class="intro">{intro}</p>'
            f"{body}</section>")


def count(value: int, warn: bool = True) -> str:
    return f'<span class="warn">{value}</span>' if value and warn else str(value)
