"""The run report as one self-contained HTML file: the header, the sections of :mod:`.sections`
and the sample browser's data, laid into ``report_page.html``.

Everything a model wrote is untrusted: it reaches the page only as JSON (every ``<``, ``>`` and
``&`` escaped as ``\\u003c`` etc., so no ``</script>`` or ``<!--`` can end the block) and is put
on screen with ``textContent`` only.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import defaultdict
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

from userturn.errors import ConfigError
from userturn.probe.plan import ProbePlan
from userturn.report import plots, sections
from userturn.report.compute import Report, categories
from userturn.report.markup import esc, fill, json_for_script, now
from userturn.report.tables import export_tables
from userturn.store.atomic import make_folder, refuse_to_replace, write_text
from userturn.store.meta import RunMeta

# The sample browser's long texts, stored once in the page and referred to by index.
SHARED_TEXTS = ("query", "answer", "prompt")
# The docs of a source checkout (none where userturn is installed from a wheel: no links then).
DOCS = Path(__file__).resolve().parents[3] / "docs"
_DOC_REF = re.compile(r"(?<![\w/.])docs/([a-z_]+)\.md")
# A note that asks the reader to act (how to correct a rate) is a caveat, not a footnote.
_CAVEAT = re.compile(r'<p class="note">(?=[^<]*userturn (?:annotate|judge) RUN)')


def render_page(report: Report, template: str, data: dict[str, Any], links: Sequence[str]) -> str:
    agreement = sections.agreement(report)
    parts = [sections.summary(report), sections.temperature_plot(report),
             sections.accuracy_plot(report), sections.labels_plot(report),
             sections.perturbations(report), sections.user_variants(report),
             sections.arms(report), sections.right_wrong(report), agreement,
             sections.samples(), sections.export(links)]
    shown = {"perturbations": bool(report.comparisons or report.unapplied),
             "agreement": bool(agreement),
             "user-variants": bool(report.variants),
             "arms": any(turn.arm != "opened" for turn in report.turns)}
    nav = "".join(f'<a href="#{sid}">{esc(title)}</a>' for sid, title in _NAV
                  if shown.get(sid, True))
    return fill(template, {"TITLE": esc(f"userturn report: {report.folder.name}"),
                           "RUN": esc(report.folder.name),
                           "HEADER": _header(report), "NAV": nav,
                           "BODY": _link_docs(_caveats("\n".join(s for s in parts if s))),
                           "DATA": json_for_script(data)})


def _link_docs(body: str) -> str:
    """Each ``docs/NAME.md`` the page cites, linked to that page of the docs where they are
    on this machine (project text only: model text is not in the body, only in its JSON)."""
    def link(match: re.Match[str]) -> str:
        page = DOCS / f"{match.group(1)}.md"
        return (f'<a href="{esc(page.as_uri())}">{match.group(0)}</a>' if page.is_file()
                else match.group(0))

    return _DOC_REF.sub(link, body)


def _caveats(body: str) -> str:
    return _CAVEAT.sub('<p class="note warn-note">', body)


_NAV = [("summary", "Summary"), ("temperature", "Temperature"), ("accuracy", "Accuracy"),
        ("labels", "Labels"), ("perturbations", "Perturbations"),
        ("user-variants", "User-turn openings"), ("arms", "Who speaks next"),
        ("right-wrong", "Right vs wrong"),
        ("agreement", "Agreement"), ("samples", "Samples"), ("export", "Export")]


# -- header ----------------------------------------------------------------------------------------
def _header(report: Report) -> str:
    meta, config = report.meta, report.meta.config
    items = [("Run folder", f"<code>{esc(report.folder)}</code>"),
             ("Report written", esc(now()))]
    for stamped, name in ((meta.started, "Run started"), (meta.finished, "Run finished")):
        if name == "Run finished" and (report.state is None or not report.state.finished):
            continue  # a finish stamp of an earlier run, before this one started: not this run's
        if stamped is not None:
            stamp = dt.datetime.fromtimestamp(stamped, dt.timezone.utc)
            items.append((name, esc(stamp.strftime("%Y-%m-%d %H:%M UTC"))))
    state = report.state
    if state is not None:
        status = state.line() or ("finished: " + state.counts())
        items.append(("Run status", f'<span class="{"" if state.line() is None else "warn"}">'
                      f"{esc(status)}</span>"))
        if state.skipped_line():
            items.append(("Skipped rows", esc(state.skipped_line())))
    turns = len(report.turns)
    items_seen = len({(t.dataset, t.item_id) for t in report.turns})
    items.append(("User turns", f"{turns} ({items_seen} items)"))
    items.append(("Labels decided by", esc(", then ".join(report.sources)) or "–"))
    counts: dict[str, int] = defaultdict(int)
    for turn in report.turns:
        for label in turn.labels:
            counts[label.source] += 1
    items.append(("Label sources stored", esc(", ".join(f"{s} ({n})" for s, n in
                                                       sorted(counts.items()))) or "none"))
    if meta.stages:
        items.append(("Time by stage", "<br>".join(esc(s.line()) for s in meta.stages)))
    versions = meta.versions
    items.append(("Versions", esc(" · ".join(f"{k} {v}" for k, v in versions.items())) or "–"))
    models = meta.models
    if models:
        items.append(("Models", "<br>".join(
            f"{esc(m)} <span class='muted'>revision {esc(v.revision)}, template "
            f"{esc(v.template_hash)}</span>" for m, v in models.items())))
    facts = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items)
    settings = "".join(f'<div><span class="k">{esc(k)}</span> {esc(_setting(v))}</div>'
                       for k, v in config.items())
    return (f'<p class="design">{esc(_design(meta))}</p><dl class="facts">{facts}</dl>'
            f'<details class="config"><summary>Full experiment config</summary>'
            f'<div class="settings">{settings}</div></details>')


def _design(meta: RunMeta) -> str:
    """One line: the experiment's design, e.g. 2 models × 1 dataset × T {0, 1} × 4 samples."""
    if not meta.config:
        return "No experiment config stored in this run."
    try:
        plan = meta.stored(ProbePlan)
    except ConfigError as exc:  # a run this version cannot read: said, and the rest still shown
        return str(exc)
    temps = ", ".join(f"{t:g}" for t in plan.temperatures)
    parts = [_plural(len(plan.models), "model"), _plural(len(plan.datasets), "dataset"),
             f"T {{{temps}}}", f"{plan.samples} samples per item at T > 0"]
    if plan.perturbations:
        parts.append(f"{_plural(len(plan.perturbations), 'perturbation')} + original")
    if [a for a in plan.answerers if a != "self"]:
        parts.append(f"answerers: {', '.join(plan.answerers)}")
    if plan.enable_thinking is not None:
        parts.append("thinking " + "/".join("on" if v else "off" for v in plan.enable_thinking))
    # The answer's thinking in the user-turn prompt: the policy changes what the prober saw.
    policy = f", answer thinking {plan.thinking}" if "thinking" in plan.model_fields_set else ""
    return " × ".join(parts) + f"; {'all' if plan.limit is None else plan.limit} items per " \
        f"dataset, seed {plan.seed}{policy}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _setting(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "–"
    return "–" if value is None else str(value)


def write_html_report(report: Report, out: Path, *, tables_dir: Path | None = None) -> Path:
    """Write the report to ``out`` (one HTML file, no network). With ``tables_dir`` the tables
    are exported there too and linked from the page."""
    out = Path(out)
    refuse_to_replace(out, force=True)  # before the tables: never over a database or a folder
    make_folder(out.parent)
    files = export_tables(report, tables_dir) if tables_dir is not None else []
    links = [_relative(path, out.parent) for path in files]
    page = render_page(report, _template(), browser_data(report), links)
    return write_text(out, page)


def _relative(path: Path, base: Path) -> str:
    try:
        return path.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return path.resolve().as_uri()


def _template() -> str:
    return resources.files("userturn.report").joinpath("report_page.html").read_text(encoding="utf-8")


def browser_data(report: Report) -> dict[str, Any]:
    """The sample browser's data: each turn as a row of :data:`~userturn.records.COLUMNS` (the
    export's columns) with every label of every source; long texts (queries, answers, prompts)
    are stored once and the row holds their index."""
    texts: dict[str, int] = {}

    def ref(value: str | None) -> int:
        return texts.setdefault(value or "", len(texts))

    turns = []
    for turn in report.turns:
        record = turn.record()
        record["model"] = turn.probed  # the browser filters by the name the tables print
        record.update({name: ref(record[name]) for name in SHARED_TEXTS})
        record["labels"] = [[lab.source, lab.label, lab.rationale, lab.error]
                            for lab in turn.labels]
        record["boundary"] = turn.boundary  # a continuation's: where the turn it opened starts
        turns.append(record)
    return {"texts": list(texts), "turns": turns, "colours": plots.LABEL_COLOURS,
            "categories": [key for key, _ in categories(report.rows)]}
