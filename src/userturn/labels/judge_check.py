"""A judge checked against people before its rates are trusted (``userturn corpus check-judge``).

The judge labels the shipped corpus's adjudicated turns of one split (the test split by default:
nothing is ever fit on it), people's turns first, then the generators' and the authored cases'
interleaved, each group in a seeded shuffle, so that any prefix (``--limit``) is a stratified
sample. Every verdict is appended to ``verdicts.jsonl`` in the check's folder as it arrives, on
disk before the next is asked for, so a check that is interrupted or killed resumes where it
stopped and a paid verdict is never asked for again (a failed one is). The figures are then read
from the stored verdicts (:func:`measure`) and written beside them as ``check.json``; a later
command finds a judge's check by its name (:func:`load_check`) and says the figure beside every
rate that rests on the judge.

Per group (people, each generator, the authored cases, and people's ShareGPT turns where the user
materialised them): Cohen's kappa 7-way and follow-up vs rest with 95% intervals over queries
(whole queries resampled), follow-up precision and recall, the follow-up rate the judge would
print against the people's, the confusion matrix, and the two annotators' own kappa on the same
turns: the ceiling a judge is read against.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from userturn.errors import UserturnError
from userturn.labels.corpus import CORPUS_FILE
from userturn.labels.judge import Judge
from userturn.records import LABELS, Case, Label, Progress, is_follow_up, silent_progress
from userturn.stats.agreement import cohen_kappa, confusion_matrix, kappa_interval
from userturn.store.atomic import write_text

PEOPLE = "people"
SHAREGPT = "people (ShareGPT)"
VERDICTS, CHECK = "verdicts.jsonl", "check.json"


@dataclass(frozen=True)
class CheckTurn:
    """One adjudicated corpus turn: what the judge sees, the people's label and both readers'."""

    key: str
    group: str  # people, a generator, authored, people (ShareGPT)
    query_group: str  # turns of one query resample together
    case: Case
    label: str
    annotations: tuple[str, str]
    split: str


def _group_of(source: dict[str, Any]) -> str:
    kind, model = str(source.get("kind", "")), str(source.get("model", "")).lower()
    if kind == "human":
        return PEOPLE
    if kind == "authored":
        return "authored"
    if "qwen" in model:
        return "qwen2.5-coder-1.5b"
    return "smollm2" if "smollm2" in model else model or "unknown"


def _turn_key(query: str, answer: str, user_turn: str) -> str:
    from userturn.labels.context import turn_key

    return turn_key(query, answer, user_turn)


def corpus_turns(split: str = "test", path: Path = CORPUS_FILE,
                 sharegpt: Path | None = None) -> list[CheckTurn]:
    """The adjudicated turns of ``split`` (``all``: every split) of the shipped corpus, and of
    people's ShareGPT turns where ``sharegpt`` (the file ``corpus/sharegpt.py materialize``
    writes) is given: a measurement set, all of it counted whatever the split."""
    turns = [_check_turn(row, _group_of(row.get("source") or {}))
             for row in _rows(path) if split == "all" or row.get("split") == split]
    if sharegpt is not None:
        turns += [_check_turn(row, SHAREGPT) for row in _rows(sharegpt)]
    return turns


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                row = json.loads(line)
                if not isinstance(row, dict) or not {"query", "answer", "user_turn",
                                                     "label"} <= row.keys():
                    raise UserturnError(f"{path}: line {number}: not an adjudicated turn "
                                        "(query, answer, user_turn, label)")
                yield row
    except (OSError, ValueError, RecursionError) as exc:
        raise UserturnError(f"{path}: cannot read the labelled turns ({exc})") from None


def _check_turn(row: dict[str, Any], group: str) -> CheckTurn:
    query, answer, turn = str(row["query"]), str(row["answer"]), str(row["user_turn"])
    readers = row.get("annotations") or {}
    labels = [str(v) for v in readers.values()] if isinstance(readers, dict) else []
    first, second = (labels + [str(row["label"])] * 2)[:2]
    return CheckTurn(_turn_key(query, answer, turn), group, " ".join(query.split()).lower(),
                     Case(query, answer, turn, turn), str(row["label"]), (first, second),
                     str(row.get("split", "")))


def judging_order(turns: Sequence[CheckTurn], seed: int = 0) -> list[CheckTurn]:
    """People first (the fewest, and the source that matters most), then the other groups
    interleaved, each in a seeded shuffle: any prefix is a stratified sample."""
    rng = random.Random(seed)
    by_group: dict[str, list[CheckTurn]] = defaultdict(list)
    for turn in sorted(turns, key=lambda t: t.key):
        by_group[turn.group].append(turn)
    for group in by_group.values():
        rng.shuffle(group)
    ordered = [*by_group.pop(PEOPLE, []), *by_group.pop(SHAREGPT, [])]
    rest = [by_group[g] for g in sorted(by_group)]
    for index in range(max(map(len, rest), default=0)):
        ordered += [group[index] for group in rest if index < len(group)]
    return ordered


# -- the verdicts, kept as they arrive --------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    judge: str
    key: str
    label: str | None
    error: str | None
    probability: float | None = None
    logprobs: list[float] | None = None  # a label-probability judge's seven, for calibration


def read_verdicts(folder: Path, judge: str) -> dict[str, Verdict]:
    """The judge's stored verdicts by turn key (the last one of a key wins: a retried failure).
    A line cut short by a kill is skipped: its verdict is asked for again."""
    found: dict[str, Verdict] = {}
    path = folder / VERDICTS
    if not path.exists():
        return found
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            try:
                row = json.loads(line)
                verdict = Verdict(str(row["judge"]), str(row["key"]), row.get("label"),
                                  row.get("error"), row.get("probability"), row.get("logprobs"))
            except (ValueError, KeyError, TypeError):
                continue
            if verdict.judge == judge and (verdict.key not in found
                                           or found[verdict.key].label is None):
                found[verdict.key] = verdict
    return found


def append_verdict(folder: Path, verdict: Verdict) -> None:
    """One verdict on disk (flushed, fsynced) before the next is asked for: a kill loses at most
    the request in flight."""
    with (folder / VERDICTS).open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(asdict(verdict), ensure_ascii=False) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _verdicts(judge: Judge, cases: Sequence[Case]
              ) -> Iterator[tuple[int, Label, list[float] | None]]:
    """(index, label, log-probabilities) as each verdict arrives. A judge read from label
    probabilities (a local model, one case at a time) keeps its seven for calibration."""
    scored = getattr(judge, "classify_with_scores", None)
    if scored is not None:
        for index, case in enumerate(cases):
            label, logprobs = scored(case)
            yield index, label, logprobs
        return
    verdicts = judge.classify_as_done(cases)
    try:
        for index, label in verdicts:
            yield index, label, None
    finally:
        verdicts.close()  # an interrupt cancels what was not sent


class NamedJudge(Judge):
    """A judge known by its name alone, for a check whose verdicts are all stored (or, with a
    ``calibration``, whose raw judge ``scores_of`` stored every turn's label scores): asking it
    anything is a bug."""

    def __init__(self, name: str, calibration: Any = None, scores_of: str | None = None) -> None:
        super().__init__(None, name=name)
        self.calibration, self.scores_of = calibration, scores_of

    def classify(self, case: Case) -> Label:
        raise RuntimeError(f"{self.name} was not built: every verdict should be stored")


def judge_corpus(judge: Judge, turns: Sequence[CheckTurn], folder: Path,
                 progress: Progress | None = None) -> tuple[int, int]:
    """Judge the ``turns`` the folder holds no good verdict of, storing each as it arrives.
    Returns (asked, failed)."""
    folder.mkdir(parents=True, exist_ok=True)
    done = read_verdicts(folder, judge.name)
    todo = [t for t in turns if t.key not in done or done[t.key].label is None]
    advance = (progress or silent_progress)(f"check {judge.name}", len(todo))
    failed = 0
    for index, label, logprobs in _verdicts(judge, [t.case for t in todo]):
        append_verdict(folder, Verdict(judge.name, todo[index].key, label.label, label.error,
                                label.probability, logprobs))
        failed += label.label is None
        advance(1)
    return len(todo), failed


# -- the figures ------------------------------------------------------------------------------

@dataclass(frozen=True)
class GroupCheck:
    """A judge against people on one group of turns (or all of them)."""

    group: str
    n: int  # turns judged with a label
    errors: int  # turns whose verdict failed
    kappa: float
    kappa_interval: tuple[float, float]
    kappa_follow_up: float
    kappa_follow_up_interval: tuple[float, float]
    precision: float  # of the judge's follow-ups, the share people called follow-ups
    recall: float  # of people's follow-ups, the share the judge found
    judge_rate: float  # the follow-up rate the judge would print
    people_rate: float  # the adjudicated rate on the same turns
    matrix: list[list[int]]  # rows: people's label, columns: the judge's (LABELS order)
    follow_up_confusion: tuple[tuple[int, int], tuple[int, int]]
    """((people yes & judge yes, people yes & judge no), (people no & judge yes, both no))."""
    annotators_kappa: float  # the two readers' own kappa on these turns: the ceiling
    annotators_kappa_follow_up: float


@dataclass(frozen=True)
class JudgeCheck:
    judge: str
    split: str
    groups: tuple[GroupCheck, ...]
    overall: GroupCheck
    asked: int  # turns in the check (the limit), judged or not
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, allow_nan=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> JudgeCheck:
        data = json.loads(text)

        def group(value: dict[str, Any]) -> GroupCheck:
            confusion = value["follow_up_confusion"]
            return GroupCheck(**{**value, "kappa_interval": tuple(value["kappa_interval"]),
                                 "kappa_follow_up_interval": tuple(
                                     value["kappa_follow_up_interval"]),
                                 "follow_up_confusion": (tuple(confusion[0]),
                                                         tuple(confusion[1]))})

        return cls(str(data["judge"]), str(data["split"]),
                   tuple(group(g) for g in data["groups"]), group(data["overall"]),
                   int(data["asked"]), tuple(data.get("notes", ())))

    def line(self) -> str:
        """The figure that travels with a rate resting on this judge."""
        people = next((g for g in self.groups if g.group == PEOPLE), None)
        shown = people or self.overall
        where = shown.group if people else "all sources"
        return (f"checked against people on {shown.n} corpus turns ({where}): "
                f"kappa follow-up vs rest {shown.kappa_follow_up:.2f}, follow-up rate "
                f"{100 * shown.judge_rate:.0f}% vs people's {100 * shown.people_rate:.0f}%")


def _follow(label: str) -> str:
    return "follow_up" if is_follow_up(label) else "other"


def measure_group(group: str, turns: Sequence[CheckTurn], verdicts: dict[str, Verdict],
                  resamples: int = 1000) -> GroupCheck:
    judged = [(t, verdicts[t.key].label) for t in turns
              if t.key in verdicts and verdicts[t.key].label is not None]
    errors = sum(1 for t in turns if t.key in verdicts and verdicts[t.key].label is None)
    pairs = [(t.label, str(label)) for t, label in judged]
    items = [t.query_group for t, _ in judged]
    binary = [(_follow(a), _follow(b)) for a, b in pairs]
    readers = [t.annotations for t, _ in judged]
    yes_yes = sum(1 for a, b in binary if a == b == "follow_up")
    yes_no = sum(1 for a, b in binary if a == "follow_up" != b)
    no_yes = sum(1 for a, b in binary if b == "follow_up" != a)
    no_no = len(binary) - yes_yes - yes_no - no_yes
    nan = float("nan")
    return GroupCheck(
        group=group, n=len(pairs), errors=errors,
        kappa=cohen_kappa(pairs) if pairs else nan,
        kappa_interval=kappa_interval(pairs, items, resamples=resamples),
        kappa_follow_up=cohen_kappa(binary, ("follow_up", "other")) if binary else nan,
        kappa_follow_up_interval=kappa_interval(binary, items, resamples=resamples,
                                                labels=("follow_up", "other")),
        precision=yes_yes / (yes_yes + no_yes) if yes_yes + no_yes else nan,
        recall=yes_yes / (yes_yes + yes_no) if yes_yes + yes_no else nan,
        judge_rate=(yes_yes + no_yes) / len(binary) if binary else nan,
        people_rate=(yes_yes + yes_no) / len(binary) if binary else nan,
        matrix=confusion_matrix(pairs) if pairs else [[0] * len(LABELS) for _ in LABELS],
        follow_up_confusion=((yes_yes, yes_no), (no_yes, no_no)),
        annotators_kappa=cohen_kappa(readers) if readers else nan,
        annotators_kappa_follow_up=cohen_kappa(
            [(_follow(a), _follow(b)) for a, b in readers], ("follow_up", "other"))
        if readers else nan)


def measure(judge: str, turns: Sequence[CheckTurn], verdicts: dict[str, Verdict], split: str,
            resamples: int = 1000) -> JudgeCheck:
    """The check's figures from the stored verdicts of ``turns`` (those in the check)."""
    order = [PEOPLE, SHAREGPT]
    names = sorted({t.group for t in turns}, key=lambda g: (g not in order,
                                                             order.index(g) if g in order else 0, g))
    groups = tuple(measure_group(name, [t for t in turns if t.group == name], verdicts,
                                 resamples) for name in names)
    # people's ShareGPT turns are a measurement of their own, outside the corpus's overall figure
    corpus = [t for t in turns if t.group != SHAREGPT]
    return JudgeCheck(judge, split, groups, measure_group("all", corpus, verdicts, resamples),
                      len(turns))


# -- where a judge's check is kept -------------------------------------------------------------

def check_folder(judge: str) -> Path:
    """Where a judge's check is kept by default: the user's cache, by the judge's name, so that
    any later command finds it (``USERTURN_CACHE`` moves it)."""
    from userturn.backends.models import cache_dir

    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", judge).strip("_")[:120]
    return cache_dir() / "judge-checks" / slug


def save_check(check: JudgeCheck, folder: Path) -> Path:
    return write_text(folder / CHECK, check.to_json())


def load_check(judge: str, folder: Path | None = None) -> JudgeCheck | None:
    """The stored check of ``judge`` (None: never checked, or the file is not one)."""
    path = (folder or check_folder(judge)) / CHECK
    try:
        check = JudgeCheck.from_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return check if check.judge == judge else None


# -- a calibration fit on the train split (never on people's turns, never on the test split) ----

def fit_calibration(judge: Any, train: Sequence[CheckTurn],
                    verdicts: dict[str, Verdict]) -> Any:
    """A :class:`~userturn.labels.local_judge.JudgeCalibration` for ``judge`` (read from label
    probabilities): a multinomial logistic map from its seven log-probabilities to the
    adjudicated label, fit on the ``train`` turns it scored."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    from userturn.labels.local_judge import LABEL_RUBRIC_VERSION, LOGPROB_FLOOR, JudgeCalibration

    rows = [(t, verdicts[t.key].logprobs) for t in train
            if t.key in verdicts and verdicts[t.key].logprobs]
    if len({t.label for t, _ in rows}) < 2:
        raise UserturnError(f"{judge.name}: too few scored train-split turns to fit a "
                            f"calibration ({len(rows)})")
    x = np.clip(np.array([scores for _, scores in rows], dtype=float), LOGPROB_FLOOR, 0.0)
    model = LogisticRegression(C=1.0, max_iter=5000).fit(x, [t.label for t, _ in rows])
    coef, bias = model.coef_, model.intercept_
    if len(model.classes_) == 2:  # one row for two classes: both, as a softmax reads them
        coef, bias = np.vstack([-coef[0] / 2, coef[0] / 2]), np.array([-bias[0] / 2, bias[0] / 2])
    groups = sorted({t.group for t, _ in rows})
    return JudgeCalibration(judge.name, str(getattr(judge.backend, "revision", "")),
                            LABEL_RUBRIC_VERSION, tuple(str(c) for c in model.classes_),
                            tuple(tuple(map(float, row)) for row in coef), tuple(map(float, bias)),
                            f"{len(rows)} train-split corpus turns of {', '.join(groups)}")


def calibrated_judge(judge: Any, calibration: Any) -> Judge:
    """``judge`` read through ``calibration``: a judge of its own name (``+cal:TAG``)."""
    from userturn.labels.local_judge import LabelProbabilityJudge

    return LabelProbabilityJudge(judge.backend, calibration=calibration)


def calibrated_verdicts(folder: Path, raw: str, calibrated: Any, turns: Sequence[CheckTurn]
                        ) -> dict[str, Verdict]:
    """The calibrated judge's verdicts of ``turns``, read from the scores the raw judge ``raw``
    stored (nothing is judged again)."""
    from userturn.labels.local_judge import calibrated_verdict

    out = {}
    for key, verdict in read_verdicts(folder, raw).items():
        if verdict.logprobs:
            label = calibrated_verdict(verdict.logprobs, calibrated.name, calibrated.calibration)
            out[key] = Verdict(calibrated.name, key, label.label, label.error, label.probability)
    return out
