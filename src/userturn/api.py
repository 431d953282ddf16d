"""The Python API: run the probe, load a run, read its turns and tables in a notebook.

Everything here is re-exported by ``userturn`` itself (``import userturn``); docs/api.md shows it
in use. Heavy libraries (torch, pandas, polars) are imported only by the calls that need them.
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from userturn.errors import ConfigError, UserturnError
from userturn.records import COLUMNS, Answer, Case, Label, Message, Turn
from userturn.stats.arms import ArmRow, arm_rows
from userturn.store.database import RunStore
from userturn.store.meta import RunMeta
from userturn.store.turns import flat_records, read_answers
from userturn.store.view import StoredRun, chosen_sources, read_stored_run

if TYPE_CHECKING:
    from userturn.chat.render import Prompt
    from userturn.config import Experiment
    from userturn.report.compute import Report
    from userturn.report.view import RunView
    from userturn.stats.summary import SummaryRow

Labels = str | Sequence[str] | None


class Run:
    """A run folder (what ``userturn run`` writes). Every call reads the stored run afresh, so a
    ``Run`` sees labels added later by ``userturn judge`` or ``userturn annotate``.

    ``labels`` (where a method takes it) names the label sources in priority order, as
    ``userturn report --labels`` does; None means the run's own."""

    def __init__(self, folder: str | Path | RunStore) -> None:
        self.folder = Path(folder.folder if isinstance(folder, RunStore) else folder)
        RunStore.read(self.folder).close()  # a folder that is no run fails here, in one line

    def __repr__(self) -> str:
        return f"Run({str(self.folder)!r})"

    def _open(self) -> closing[RunStore]:
        return closing(RunStore.read(self.folder))

    @property
    def meta(self) -> RunMeta:
        """The run's stored metadata: its experiment config, models, versions, label sources."""
        with self._open() as store:
            return store.meta()

    def label_sources(self, labels: Labels = None) -> list[str]:
        """The label sources a read with ``labels`` resolves turns with, in priority order."""
        return chosen_sources(self.meta, labels)

    def turns(self, labels: Labels = None) -> list[Turn]:
        """Every generated user turn, with its context, its labels and its resolved label."""
        return self.stored(labels).turns

    def answers(self) -> list[Answer]:
        """Every assistant answer the user turns follow, with its task score (the answers
        alone are read)."""
        with self._open() as store:
            return read_answers(store)

    def stored(self, labels: Labels = None) -> StoredRun:
        """The run read once, as stored: meta, label sources, turns, answers, run state (what
        :meth:`view` adds the corrected rates' inputs to)."""
        with self._open() as store:
            return read_stored_run(store, labels)

    def summary(self, labels: Labels = None) -> list[SummaryRow]:
        """The rows of ``userturn report``'s table: the follow-up rate with its interval, label
        counts, undecided / invalid / failed turns and task accuracy per condition."""
        return self.view(labels).summary()

    def arms(self, labels: Labels = None) -> list[ArmRow]:
        """The continuation arm beside the opened one, per condition: the share of
        continuations that open a user turn, the unforced follow-up rate and the rate over the
        user turns written, the opened arm's rate and the paired difference, the mean
        next-role probabilities (empty for a run of the opened arm alone)."""
        return arm_rows(self.turns(labels))

    def summary_frame(self, labels: Labels = None) -> Any:
        """The summary as a pandas DataFrame: the columns and numbers of the report's
        ``summary.csv``, one row per condition, numbers as numeric columns (a count that can be
        missing, such as ``accuracy_hits``, as the nullable ``Int64``)."""
        from userturn.report.compute import Report
        from userturn.report.tables import tables

        view = self.view(labels)
        # The summary's rows alone: the other tables (bootstraps over perturbations and
        # models) are not computed for it.
        rows = Report(view.folder, view.meta, view.sources, view.summary(), [], [], [], [])
        return _frame(tables(rows)["summary"])

    def frames(self, labels: Labels = None) -> dict[str, Any]:
        """Every table of the report (``summary``, ``labels``, ``perturbations``,
        ``accuracy_vs_follow_up``, ``right_vs_wrong``, ...) as pandas DataFrames, with the
        columns of its CSV file; the user turns themselves are ``to_pandas()``."""
        from userturn.report.tables import tables

        return {name: _frame(records) for name, records in tables(self.report(labels)).items()
                if name != "user_turns"}

    def report(self, labels: Labels = None) -> Report:
        """Every number of the HTML report (perturbation effects, accuracy panels, ...)."""
        return self.view(labels).report()

    def view(self, labels: Labels = None) -> RunView:
        """The run read once: meta, label sources, turns, answers, run state; ``summary`` and
        ``report`` are computed from it."""
        from userturn.report.view import read_run

        with self._open() as store:
            return read_run(store, labels)

    def records(self, labels: Labels = None) -> list[dict[str, Any]]:
        """One flat dict per user turn, with the columns of ``userturn export`` (every label
        source's label and probability after :data:`COLUMNS`)."""
        return flat_records(self.turns(labels))[1]

    def to_pandas(self, labels: Labels = None) -> Any:
        """The user turns as a pandas DataFrame (the export's columns, one row per turn)."""
        try:
            import pandas as pd
        except ImportError:
            raise UserturnError("to_pandas needs pandas: pip install pandas") from None
        columns, records = flat_records(self.turns(labels))
        return pd.DataFrame(records, columns=columns)

    def to_polars(self, labels: Labels = None) -> Any:
        """The user turns as a polars DataFrame (the export's columns, one row per turn)."""
        try:
            import polars as pl
        except ImportError:
            raise UserturnError("to_polars needs polars: pip install polars") from None
        records = self.records(labels)
        if not records:
            return pl.DataFrame(schema=list(COLUMNS))
        return pl.DataFrame(records, infer_schema_length=None)


def _frame(records: Sequence[Mapping[str, Any]]) -> Any:
    """Flat records as a DataFrame with typed columns: whole numbers as int64 (``Int64`` where
    one is missing), other numbers as float64, yes/no as ``boolean``, and a column with no
    value at all as float64 NaN (as pandas reads the empty column of the CSV)."""
    try:
        import pandas as pd
    except ImportError:
        raise UserturnError("DataFrames need pandas: pip install pandas") from None
    columns = list(dict.fromkeys(name for record in records for name in record))
    frame = pd.DataFrame.from_records(list(records), columns=columns)
    for name in columns:
        found = [r.get(name) for r in records if r.get(name) is not None]
        complete = len(found) == len(records)
        if all(isinstance(v, bool) for v in found) and found:
            frame[name] = frame[name].astype("boolean")
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in found) and found:
            frame[name] = frame[name].astype("int64" if complete else "Int64")
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in found):
            frame[name] = frame[name].astype("float64")
    return frame


def load_run(folder: str | Path) -> Run:
    """The run stored in ``folder``; raises ``StoreError`` when it holds no run."""
    return Run(folder)


def run(experiment: Experiment | Mapping[str, Any] | str | Path | None = None, *,
        progress: bool = True, **overrides: Any) -> Run:
    """Run (or resume) an experiment and return the run.

    ``experiment`` is an ``Experiment``, a dict of its settings, or the path of an experiment
    YAML file; keyword arguments override single settings, e.g.
    ``run(models=["tiny"], limit=3, output="runs/try")``. A finished run re-run makes no model
    calls. ``progress``: bars for each stage, as the commands show them (in a notebook, as its
    live output)."""
    from contextlib import nullcontext

    from userturn.config import Experiment, load_experiment
    from userturn.probe.pipeline import run_experiment
    from userturn.report.progress import progress_bars

    if isinstance(experiment, Experiment):
        exp = load_experiment(None, {**experiment.model_dump(), **overrides})
    elif isinstance(experiment, Mapping):
        exp = load_experiment(None, {**experiment, **overrides})
    else:
        exp = load_experiment(Path(experiment) if experiment else None, overrides)
    with progress_bars() if progress else nullcontext(None) as bars:
        run_experiment(exp, progress=bars).close()
    return Run(exp.output)


def render_user_turn(model: str, messages: Sequence[Message], *,
                     tokenizer: str | None = None) -> Prompt:
    """The exact probe prompt of ``model`` after ``messages`` (``[system?, user, assistant]``):
    the model's own chat template with an open user turn. ``Prompt.text`` is the prompt,
    ``Prompt.stop`` the markers that end the user turn, as ``userturn render`` prints them."""
    from userturn.backends import load_template
    from userturn.chat.render import render_user_turn as render

    return render(load_template(model, tokenizer), messages)


CaseLike = Case | Turn | Mapping[str, Any]


def classify(cases: Iterable[CaseLike], labeller: str = "rules",
             classifier: str | Path | None = None) -> list[Label]:
    """Label user turns, as ``userturn classify`` does. ``cases`` are ``Case`` values,
    ``Turn``s of a run, or dicts with the fields ``query``, ``answer`` and ``user_turn`` (as
    ``userturn export`` writes them).

    ``labeller``: ``rules`` decides the clear cases and leaves the rest undecided
    (``Label.label`` None); ``classifier`` labels every turn with a probability; ``cascade``
    takes the rules' label where they decide and the classifier's elsewhere (each label's
    ``source`` says which). ``classifier``: parameters from ``userturn train-classifier``
    (default: the shipped ones)."""
    from userturn.labels.stages import label_cases

    return label_cases(labeller, [_case(case) for case in cases],
                       Path(classifier) if classifier else None)


def _case(value: CaseLike) -> Case:
    if isinstance(value, Case):
        return value
    if isinstance(value, Turn):
        return value.case()
    missing = [name for name in ("query", "answer", "user_turn") if name not in value]
    if missing:
        raise ConfigError(f"a case needs the fields query, answer and user_turn; missing: "
                          f"{', '.join(missing)}")
    return Case(str(value["query"]), str(value["answer"] or ""), str(value["user_turn"] or ""),
                str(value.get("raw_user_turn") or value["user_turn"] or ""),
                thinking=str(value.get("thinking") or ""))
