"""A judge you run yourself: the rubric's verdict read from the labels' probabilities.

An API judge writes a verdict that is parsed (:mod:`.judge`). A model we run ourselves
(transformers on a GPU or the CPU, llama.cpp) can do better: render the same rubric and case with
the model's own chat template, open its answer with ``Label:``, and read in one forward pass how
likely each of the seven labels is as the next words. The verdict is the most likely label; its
probability, renormalised over the seven, is stored with the label, so the cascade and the
corrected rates can use it. Nothing is generated, so nothing can be malformed; what can go wrong
is said as an error label, never guessed:

- the model puts little probability on any label (``min_mass``: it would rather say something
  else, e.g. a refusal or prose), so its choice among them means little;
- the engine fails (a prompt longer than its context, a broken backend), or a score is not a
  finite number.

The rubric's prefix is the same for every case, and the engines keep the key-value state of the
previous prompt (:mod:`userturn.backends.options`): on the CPU the rubric is read once per process.

A small judge's label probabilities lean: the 1.5B judge measured in docs/classifier.md almost
never says ``new_query``, whatever the turn. A :class:`JudgeCalibration` (a multinomial logistic
map from the seven log-probabilities to the label, fit on labelled turns by
``benchmarks/judge_quality.py --fit-calibration``) corrects that; the verdict is then the
calibrated distribution's most likely label, stored under a name that says which calibration.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from userturn.backends.options import OptionScorer
from userturn.errors import ConfigError
from userturn.labels.judge import RUBRIC_VERSION, Judge, case_message, rubric
from userturn.labels.rules import thinking_only
from userturn.records import LABELS, Case, Label
from userturn.settings import bad_text, parse_json, utf8_reason

# The rubric's text is rubric 1's; the answer format differs (the label alone), so its verdicts
# are stored under their own version.
LABEL_RUBRIC_VERSION = f"{RUBRIC_VERSION}-labels"
ANSWER_PREFIX = "Label:"
OPTIONS = tuple(f" {label}" for label in LABELS)  # a space-led word: one clean token boundary
MIN_LABEL_MASS = 0.2
# A calibration's weights and biases are refused beyond this: a fit gives single digits, and
# within it no score (seven log-probabilities of at least LOGPROB_FLOOR) can overflow.
MAX_CALIBRATION_WEIGHT = 1e6
# A calibration reads log-probabilities floored here, as it was fit (a label the model all but
# rules out would otherwise weigh by how far out; -inf would break the arithmetic).
LOGPROB_FLOOR = -50.0
# The judge reads the query's beginning and the answer's end (what the user read last); long
# texts are cut in the middle, which the prompt shows, so a CPU judge's cost stays bounded.
MAX_QUERY_CHARS = 2000
MAX_ANSWER_CHARS = 3000

_LABEL_OUTPUT = (f"Answer with \"{ANSWER_PREFIX}\" and the label alone, one of: "
                 f"{', '.join(LABELS)}.")


def _label_example(query: str, answer: str, turn: str, label: str, why: str) -> str:
    return f"QUERY: {query}\nASSISTANT: {answer}\nUSER_TURN: {turn}\n{ANSWER_PREFIX} {label}"


def label_rubric() -> str:
    """The system prompt: rubric 1's labels, rules and examples, answered by the label alone."""
    return rubric(_label_example, _LABEL_OUTPUT)


def clip_middle(text: str, limit: int, keep_head: float) -> str:
    """``text`` cut to about ``limit`` characters, the cut shown: ``keep_head`` of the budget
    from its beginning, the rest from its end."""
    if len(text) <= limit:
        return text
    head = int(limit * keep_head)
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[len(text) - tail:]}"


def judged_case(case: Case) -> Case:
    """The case as the judge reads it: the query's beginning, the answer's end."""
    return Case(clip_middle(case.query, MAX_QUERY_CHARS, 0.75),
                clip_middle(case.answer, MAX_ANSWER_CHARS, 0.25), case.user_turn,
                case.raw_user_turn, case.assistant_header, case.thinking)


def label_prompt(template, case: Case) -> str:  # type: ignore[no-untyped-def]
    """The raw prompt whose next words are the verdict, in the judge model's own template."""
    from userturn.chat.render import render_assistant_turn

    messages = [{"role": "system", "content": label_rubric()},
                {"role": "user", "content": case_message(judged_case(case))}]
    return render_assistant_turn(template, messages).text + ANSWER_PREFIX


def verdict_from_logprobs(logprobs: Sequence[float], source: str,
                          min_mass: float = MIN_LABEL_MASS) -> Label:
    """The label (with its probability among the seven) from the seven labels' log-probabilities,
    in the order of ``LABELS``; an error label where they are missing, not numbers, or carry too
    little probability to choose by."""
    if len(logprobs) != len(LABELS):
        return Label(None, source, "", error=f"invalid: {len(logprobs)} label scores for "
                                               f"{len(LABELS)} labels")
    if not all(isinstance(v, (int, float)) and not math.isnan(v) and v <= 1e-6
               for v in logprobs):
        return Label(None, source, "", error=f"invalid: label scores {list(logprobs)!r} are not "
                                              "log-probabilities")
    probabilities = [math.exp(v) for v in logprobs]
    mass = sum(probabilities)
    if mass < min_mass or mass <= 0.0:
        return Label(None, source, "", error=f"invalid: the labels carry {mass:.3f} of the "
                                              f"judge's probability (at least {min_mass} needed)")
    best = max(range(len(LABELS)), key=probabilities.__getitem__)
    p = probabilities[best] / mass
    return Label(LABELS[best], source, f"p={p:.2f} (label mass {mass:.2f})",  # type: ignore[arg-type]
                 probability=p)


@dataclass(frozen=True)
class JudgeCalibration:
    """The label from the judge's seven log-probabilities: softmax(weights . logprobs + bias),
    fit for one judge model (``revision``: its backend's revision, e.g. the GGUF's content
    hash, so the file holds wherever the model lives) and one rubric on labelled turns
    (``judge``: the judge's name when it was fit, for the reader)."""

    judge: str
    revision: str
    rubric: str
    labels: tuple[str, ...]
    weights: tuple[tuple[float, ...], ...]  # one row per label in ``labels``, one column per LABELS
    bias: tuple[float, ...]
    fit_on: str = ""  # which turns, in words (the data card of the calibration)

    @property
    def tag(self) -> str:
        """A short hash of the numbers: the stored source names the calibration it used."""
        numbers = json.dumps([self.labels, self.weights, self.bias])
        return hashlib.sha256(numbers.encode()).hexdigest()[:8]

    def probabilities(self, logprobs: Sequence[float]) -> dict[str, float]:
        scores = [sum(w * max(v, LOGPROB_FLOOR) for w, v in zip(row, logprobs)) + b
                  for row, b in zip(self.weights, self.bias)]
        if not all(map(math.isfinite, scores)):  # unbounded numbers overflowed: no answer
            return {label: math.nan for label in self.labels}
        top = max(scores)
        exps = [math.exp(s - top) for s in scores]
        total = sum(exps)
        return {label: e / total for label, e in zip(self.labels, exps)}

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"judge": self.judge, "revision": self.revision,
                                    "rubric": self.rubric, "labels": list(self.labels),
                                    "weights": [list(r) for r in self.weights],
                                    "bias": list(self.bias), "fit_on": self.fit_on}, indent=1)
                        + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> JudgeCalibration:
        """A calibration file, checked whole: a file that is not one, is damaged, or holds
        numbers that could make a probability NaN is one error line naming the file and what
        is wrong, at load, before any judge runs."""
        try:
            data = parse_json(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ConfigError(f"{path} is not a judge calibration ({unreadable(exc)})") from None
        problem = calibration_problem(data)
        if problem is not None:
            raise ConfigError(f"{path} is not a judge calibration: {problem}; fit one with "
                              "benchmarks/judge_quality.py --fit-calibration")
        return cls(data["judge"], data["revision"], data["rubric"], tuple(data["labels"]),
                   tuple(tuple(float(w) for w in row) for row in data["weights"]),
                   tuple(float(b) for b in data["bias"]), data.get("fit_on", ""))


def unreadable(error: Exception) -> str:
    """Why a file did not read, in words (not an exception's name)."""
    if isinstance(error, json.JSONDecodeError):
        return f"invalid JSON: {error.msg} at line {error.lineno}"
    if isinstance(error, UnicodeDecodeError):
        return f"not UTF-8 text (byte {error.start})"
    if isinstance(error, OSError):
        return error.strerror or str(error)
    return str(error)


def calibration_problem(data: object) -> str | None:
    """What makes ``data`` (a parsed calibration file) unusable, or None: the text fields,
    labels each at most once, one row of seven weights and one bias per label, every number
    finite and within :data:`MAX_CALIBRATION_WEIGHT` (so no score overflows and no
    probability comes out NaN)."""
    if not isinstance(data, dict):
        return "it is not a JSON object"
    for name in ("judge", "revision", "rubric", "labels", "weights", "bias"):
        if name not in data:
            return f"{name} is missing"
    for name in ("judge", "revision", "rubric", "fit_on"):
        if not isinstance(data.get(name, ""), str):
            return f"{name} is not text"
    if (found := bad_text(data)) is not None:  # it is printed and stored with the source
        return f"{found[0]}: {utf8_reason(found[1])}"
    labels = data["labels"]
    # A fit knows only the labels its turns had (a subset); a label listed twice would be two
    # rows read as one.
    if not isinstance(labels, list) or not labels or \
            not all(isinstance(label, str) and label in LABELS for label in labels) or \
            len(set(labels)) != len(labels):
        return (f"labels must be labels of docs/labels.md, each at most once "
                f"({', '.join(LABELS)}), not {str(labels)[:200]}")
    weights, bias = data["weights"], data["bias"]
    if not isinstance(weights, list) or len(weights) != len(labels) or not all(
            isinstance(row, list) and len(row) == len(LABELS) for row in weights):
        return f"weights must be {len(labels)} rows of {len(LABELS)} numbers, one per label"
    if not isinstance(bias, list) or len(bias) != len(labels):
        return f"bias must be {len(labels)} numbers, one per label"
    numbers = [(f"weights[{i}][{j}]", w) for i, row in enumerate(weights)
               for j, w in enumerate(row)] + [(f"bias[{i}]", b) for i, b in enumerate(bias)]
    for where, value in numbers:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{where} is {str(value)[:40]}, not a number"
        if not abs(value) <= MAX_CALIBRATION_WEIGHT:  # NaN too; an int of 400 digits as well
            return (f"{where} is {str(value)[:40]}, not a number within "
                    f"±{MAX_CALIBRATION_WEIGHT:g}")
    return None


def calibrated_verdict(logprobs: Sequence[float], source: str, calibration: JudgeCalibration,
                       min_mass: float = MIN_LABEL_MASS) -> Label:
    """The calibrated label of the seven log-probabilities, with its calibrated probability;
    the same error labels as :func:`verdict_from_logprobs` where the scores are not usable."""
    raw = verdict_from_logprobs(logprobs, source, min_mass)
    if raw.error is not None:
        return raw
    probabilities = calibration.probabilities(logprobs)
    best = max(probabilities, key=probabilities.__getitem__)
    # A loaded calibration cannot give NaN (its numbers are bounded); one built otherwise may:
    # a number that is not a probability is an error verdict, never a label.
    if not 0.0 <= probabilities[best] <= 1.0:
        return Label(None, source, "", error=f"invalid: the calibration gave "
                                              f"{probabilities[best]!r}, not a probability")
    return Label(best, source, f"p={probabilities[best]:.2f} calibrated "  # type: ignore[arg-type]
                 f"(judge said {raw.label}, {raw.rationale})", probability=probabilities[best])


class LabelProbabilityJudge(Judge):
    """A judge on a local model that can score continuations (``score_options``)."""

    version = LABEL_RUBRIC_VERSION

    def __init__(self, backend: OptionScorer, *, name: str | None = None,
                 min_mass: float = MIN_LABEL_MASS,
                 calibration: JudgeCalibration | None = None) -> None:
        spec = getattr(backend, "spec", type(backend).__name__)
        name = name or f"judge:{spec}@rubric{LABEL_RUBRIC_VERSION}"
        if calibration is not None:
            revision = str(getattr(backend, "revision", ""))
            if (calibration.revision, calibration.rubric) != (revision, LABEL_RUBRIC_VERSION):
                raise ConfigError(
                    f"the judge calibration was fit for model {calibration.revision} and rubric "
                    f"{calibration.rubric}, not {revision} and {LABEL_RUBRIC_VERSION} "
                    f"({calibration.judge} then, {name} now): fit one for this judge "
                    "(benchmarks/judge_quality.py --fit-calibration)")
            name = f"{name}+cal:{calibration.tag}"  # calibrated labels are another source
        super().__init__(None, name=name, concurrency=1)
        self.backend, self.min_mass, self.calibration = backend, min_mass, calibration
        # One model, one key-value state: concurrent callers (a scorer under Inspect, a run
        # with judge_concurrency > 1) take turns, which costs nothing on one device.
        self._lock = threading.Lock()

    def classify(self, case: Case) -> Label:
        return self.classify_with_scores(case)[0]

    def prompt(self, case: Case) -> str:
        """The raw prompt whose next words are the verdict (a study of another rubric, e.g.
        ``benchmarks/judge_quality.py --few-shot``, overrides it under a name of its own)."""
        return label_prompt(self.backend.template, case)  # type: ignore[attr-defined]

    def classify_with_scores(self, case: Case) -> tuple[Label, list[float] | None]:
        """The verdict and the seven labels' log-probabilities it was read from (in the order
        of ``LABELS``; None where none were read), for a study that recalibrates or combines
        them."""
        if case.thinking.strip() and not case.user_turn.strip():
            return thinking_only(self.name), None
        try:
            prompt = self.prompt(case)
            with self._lock:
                logprobs = list(self.backend.score_options(prompt, OPTIONS))
        except Exception as exc:  # a labeller must never break the batch: stored, counted
            return self._error(f"request failed: {type(exc).__name__}: {exc}"), None
        if self.calibration is not None:
            return calibrated_verdict(logprobs, self.name, self.calibration,
                                      self.min_mass), logprobs
        return verdict_from_logprobs(logprobs, self.name, self.min_mass), logprobs
