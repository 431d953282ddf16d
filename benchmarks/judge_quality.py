"""A judge against people: every adjudicated turn of the labelled corpus, judged and compared.

    .venv/bin/python benchmarks/judge_quality.py --judge llamacpp/corpus/work/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
    .venv/bin/python benchmarks/judge_quality.py --judge smollm2 --limit 40   # the floor, a sample
    .venv/bin/python benchmarks/judge_quality.py --table corpus/judge_verdicts_qwen.jsonl  # table only
    .venv/bin/python benchmarks/judge_quality.py --table corpus/judge_verdicts_qwen.jsonl \
        --calibrate --fit-calibration corpus/judge_calibration_qwen.json  # the calibrated judge
    .venv/bin/python benchmarks/judge_quality.py --judge ... --few-shot 14 --split dev \
        --groups smollm2,qwen2.5-coder-1.5b --verdicts F   # a rubric study, chosen on dev
    .venv/bin/python benchmarks/judge_quality.py --table G --same-turns-as F  # G on F's turns
    .venv/bin/python benchmarks/judge_quality.py --judge ... \
        --corpus corpus/work/people_sharegpt.jsonl.gz --verdicts F  # people's ShareGPT turns

A judge is not fit to the corpus, so every adjudicated turn counts (all splits). Turns are judged
in a fixed order that keeps any prefix a stratified sample: people's turns first (the fewest),
then the generators' and the authored cases' turns interleaved, each group in a seeded shuffle.
Every verdict is appended to ``--verdicts`` as it arrives (the judge's name, the turn's key, label,
probability, error, seconds, and a label-probability judge's seven log-probabilities), so a long
CPU job can be stopped and resumed and several judges share one file. Printed per group (each
generator, people, authored): turns judged, errors, Cohen's kappa 7-way and follow-up vs rest with
95% intervals over queries (whole queries resampled), follow-up precision and recall, and the
judge's turns/s on this machine.

``--calibrate`` measures a calibrated judge from the stored log-probabilities (nothing is judged
again): a multinomial logistic map from the seven log-probabilities to the label, fit on the
train split of every source but the one it is measured on, and never on people's turns, so each
row is a source the calibration was not fit to. ``--calibrated-verdicts FILE`` writes those
out-of-source verdicts (for ``leave_one_model_out.py --judge-verdicts``); ``--fit-calibration FILE``
fits the one to ship on every train-split turn of the generators and the authored cases
(``userturn run --judge SPEC --judge-calibration FILE``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).parent))
from leave_one_model_out import (  # noqa: E402
    Turn,
    kappa_interval,
    read_corpus,
    verdict_rows,
)

from userturn.labels.context import turn_key  # noqa: E402
from userturn.labels.corpus import CORPUS_FILE  # noqa: E402
from userturn.labels.training import evaluate  # noqa: E402

GROUPS = ("human", "smollm2", "qwen2.5-coder-1.5b", "authored")
DEFAULT_VERDICTS = Path(__file__).resolve().parent.parent / "corpus" / "judge_verdicts_qwen.jsonl"


def key_of(turn: Turn) -> str:
    case = turn.example.case
    return turn_key(case.query, case.answer, case.user_turn)


def judging_order(turns: Sequence[Turn], seed: int = 0) -> list[Turn]:
    """People first, then the other groups interleaved, each shuffled: any prefix is a sample."""
    rng = random.Random(seed)
    by_group: dict[str, list[Turn]] = defaultdict(list)
    for turn in turns:
        by_group[turn.generator].append(turn)
    for group in by_group.values():
        rng.shuffle(group)
    ordered = list(by_group.pop("human", []))
    rest = [by_group[g] for g in sorted(by_group)]
    for index in range(max(map(len, rest), default=0)):
        ordered += [group[index] for group in rest if index < len(group)]
    return ordered


def few_shot_cases(turns: Sequence[Turn], count: int) -> list[Turn]:
    """``count`` worked cases for the rubric from the generators' and the authored train split
    (never people's, never dev or test): the labels in turn, each time the shortest case of that
    label not taken yet, so that every label is shown before any twice."""
    from userturn.records import LABELS

    pool = sorted((t for t in turns if t.example.split == "train" and t.generator != "human"),
                  key=lambda t: (len(t.example.case.query) + len(t.example.case.answer)
                                 + len(t.example.case.user_turn), key_of(t)))
    chosen: list[Turn] = []
    while len(chosen) < count:
        before = len(chosen)
        for label in LABELS:
            found = next((t for t in pool if t.example.label == label and t not in chosen), None)
            if found is not None and len(chosen) < count:
                chosen.append(found)
        if len(chosen) == before:
            break
    return chosen


def few_shot_judge(judge, cases: Sequence[Turn]):  # type: ignore[no-untyped-def]
    """The label-probability ``judge`` with ``cases`` added to its rubric as worked cases and the
    case's closing line asking for the label alone (rubric 1's asks for the JSON verdict, which
    the label judge does not read), under a name of its own."""
    from userturn.chat.render import render_assistant_turn
    from userturn.labels.judge import case_message
    from userturn.labels.local_judge import (
        ANSWER_PREFIX,
        LabelProbabilityJudge,
        judged_case,
        label_rubric,
    )

    def shown(turn: Turn) -> str:
        case = judged_case(turn.example.case)
        return (f"QUERY: {case.query}\nASSISTANT: {case.answer}\nUSER_TURN: {case.user_turn}\n"
                f"{ANSWER_PREFIX} {turn.example.label}")

    system = f"{label_rubric()}\n\nCases people labelled:\n\n" + "\n\n".join(map(shown, cases))
    reply = f"Answer with \"{ANSWER_PREFIX}\" and the label alone."

    class FewShot(LabelProbabilityJudge):
        def prompt(self, case):  # type: ignore[no-untyped-def]
            messages = [{"role": "system", "content": system},
                        {"role": "user", "content": case_message(judged_case(case), reply)}]
            return render_assistant_turn(self.backend.template, messages).text + ANSWER_PREFIX

    return FewShot(judge.backend, name=f"{judge.name}+fewshot{len(cases)}")


def judge_corpus(spec: str, turns: Sequence[Turn], path: Path, limit: int | None,
                 few_shot: Sequence[Turn] = ()) -> str:
    """Judge the turns not yet in ``path`` (at most ``limit`` in all); returns the judge's name."""
    from userturn.labels.judges import judge_from_spec

    judge = judge_from_spec(spec)
    if few_shot:
        judge = few_shot_judge(judge, few_shot)
    done = verdict_rows(path, judge.name)
    todo = [t for t in turns if key_of(t) not in done]
    if limit is not None:
        todo = todo[:max(0, limit - len(done))]
    print(f"{judge.name}: {len(done)} turns judged before, {len(todo)} to judge", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        for index, turn in enumerate(todo, 1):
            start = time.perf_counter()
            # A label-probability judge also gives the seven log-probabilities, kept for a
            # study that recalibrates them (fit on the train split, judged on people).
            scored = getattr(judge, "classify_with_scores", None)
            label, logprobs = scored(turn.example.case) if scored else (
                judge.classify(turn.example.case), None)
            seconds = time.perf_counter() - start
            row = {"judge": judge.name, "key": key_of(turn), "group": turn.generator,
                   "label": label.label, "probability": label.probability,
                   "error": label.error, "seconds": round(seconds, 3)}
            if logprobs is not None:
                row["logprobs"] = [round(v, 5) for v in logprobs]
            out.write(json.dumps(row) + "\n")
            out.flush()
            if index % 25 == 0 or index == len(todo):
                print(f"  {index}/{len(todo)} ({seconds:.1f} s the last)", flush=True)
    return judge.name


def table(turns: Sequence[Turn], verdicts: dict[str, dict], draws: int) -> list[str]:
    lines = ["| group | judged | errors | kappa7 [95% CI] | kappaF [95% CI] | F-P | F-R | "
             "turns/s |", "|---|---|---|---|---|---|---|---|"]
    for group in (*GROUPS, "all"):
        chosen = [t for t in turns if (group == "all" or t.generator == group)
                  and key_of(t) in verdicts]
        if not chosen:
            continue
        rows = [verdicts[key_of(t)] for t in chosen]
        ok = [(t, row) for t, row in zip(chosen, rows) if row["label"] is not None]
        predicted = [row["label"] for _, row in ok]
        reference = [t.example.label for t, _ in ok]
        seconds = sum(row["seconds"] for row in rows)
        rate = f"{len(rows) / seconds:.3f}" if seconds else "-"
        if not ok:
            lines.append(f"| {group} | {len(rows)} | {len(rows)} | - | - | - | - | {rate} |")
            continue
        e = evaluate(predicted, reference)
        (k_lo, k_hi), (f_lo, f_hi) = kappa_interval(
            predicted, reference, [t.example.group for t, _ in ok], draws)
        f = e.per_label.get("follow_up", {})
        lines.append(
            f"| {group} | {len(rows)} | {len(rows) - len(ok)} | {e.kappa:.3f} [{k_lo:.2f}, "
            f"{k_hi:.2f}] | {e.kappa_follow_up:.3f} [{f_lo:.2f}, {f_hi:.2f}] | "
            f"{f.get('precision', float('nan')):.2f} | {f.get('recall', float('nan')):.2f} | "
            f"{rate} |")
    return lines


def calibration_rows(turns: Sequence[Turn], verdicts: dict[str, dict]) -> list[tuple[Turn, dict]]:
    """The judged turns whose verdict kept the seven log-probabilities."""
    return [(t, verdicts[key_of(t)]) for t in turns
            if key_of(t) in verdicts and verdicts[key_of(t)].get("logprobs")]


def fit_calibration(rows: Sequence[tuple[Turn, dict]], judge: str, fit_on: str,  # type: ignore[no-untyped-def]
                    revision: str = ""):
    """A JudgeCalibration fit on ``rows`` (their reference labels), by multinomial logistic
    regression on the clipped log-probabilities; ``revision``: the judge model's."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    from userturn.labels.local_judge import LABEL_RUBRIC_VERSION, LOGPROB_FLOOR, JudgeCalibration

    x = np.clip(np.array([row["logprobs"] for _, row in rows], dtype=float), LOGPROB_FLOOR, 0.0)
    y = [turn.example.label for turn, _ in rows]
    model = LogisticRegression(C=1.0, max_iter=5000).fit(x, y)
    coef, bias = model.coef_, model.intercept_
    if len(model.classes_) == 2:  # sklearn gives one row for two classes: both, as softmax
        coef, bias = np.vstack([-coef[0] / 2, coef[0] / 2]), np.array([-bias[0] / 2, bias[0] / 2])
    return JudgeCalibration(judge, revision, LABEL_RUBRIC_VERSION,
                            tuple(str(c) for c in model.classes_),
                            tuple(tuple(map(float, row)) for row in coef),
                            tuple(map(float, bias)), fit_on)


def judge_revision(judge: str) -> str:
    """The revision of the model a judge's name (``judge:SPEC@rubric...``) names, read from the
    model as a run would load it (a GGUF's content hash): a calibration holds for that model
    wherever it lives."""
    from userturn.backends import load_backend

    spec = judge.removeprefix("judge:").rpartition("@")[0]
    return str(load_backend(spec, batch_size=1).revision)


def out_of_source_verdicts(turns: Sequence[Turn], verdicts: dict[str, dict]) -> dict[str, dict]:
    """Each source's turns labelled by a calibration fit on the other sources' train split
    (people are never fit on), as verdict rows."""
    from userturn.labels.local_judge import calibrated_verdict

    rows = calibration_rows(turns, verdicts)
    judge = next(iter(verdicts.values()))["judge"] if verdicts else ""
    out: dict[str, dict] = {}
    for group in GROUPS:
        fit = [(t, r) for t, r in rows if t.generator not in (group, "human")
               and t.example.split == "train"]
        measured = [(t, r) for t, r in rows if t.generator == group]
        if not fit or not measured:
            continue
        calibration = fit_calibration(fit, judge, f"train split of all but {group} and people")
        for turn, row in measured:
            label = calibrated_verdict(row["logprobs"], f"{judge}+cal:out-of-source", calibration)
            out[key_of(turn)] = {**row, "judge": label.source, "label": label.label,
                                 "probability": label.probability, "error": label.error}
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--judge", help="a local model spec (llamacpp/FILE.gguf, smollm2, a "
                                        "folder) or openai/MODEL; omit to print the table only")
    parser.add_argument("--verdicts", type=Path, default=DEFAULT_VERDICTS,
                        help="where verdicts are appended and read back (resumable)")
    parser.add_argument("--table", type=Path, default=None,
                        help="print the table of this verdicts file (one judge) and stop")
    parser.add_argument("--corpus", type=Path, default=CORPUS_FILE)
    parser.add_argument("--limit", type=int, default=None,
                        help="judge at most this many turns in all (a stratified prefix)")
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--few-shot", type=int, default=0, metavar="N",
                        help="a label-probability judge with N worked cases from the generators' "
                             "train split added to its rubric (a study: named +fewshotN)")
    parser.add_argument("--split", choices=("train", "dev", "test"), default=None,
                        help="judge only this split's turns (choose a rubric on dev)")
    parser.add_argument("--groups", default=None,
                        help="judge only these groups, comma-separated (" + ", ".join(GROUPS) + ")")
    parser.add_argument("--same-turns-as", type=Path, default=None, metavar="FILE",
                        help="the table on the turns another verdicts file judged (compare two "
                             "rubrics on the same turns)")
    parser.add_argument("--calibrate", action="store_true",
                        help="also the calibrated judge, each source measured by a calibration "
                             "fit on the others' train split (never on people)")
    parser.add_argument("--calibrated-verdicts", type=Path, default=None,
                        help="with --calibrate: write its out-of-source verdicts here")
    parser.add_argument("--fit-calibration", type=Path, default=None,
                        help="fit the calibration on every generator's and authored train-split "
                             "turn and write it here (the file --judge-calibration reads)")
    args = parser.parse_args(argv)
    corpus = read_corpus(args.corpus)
    shots = few_shot_cases(corpus, args.few_shot) if args.few_shot else []
    turns = judging_order([t for t in corpus if (args.split is None or t.example.split == args.split)
                           and (args.groups is None or t.generator in args.groups.split(","))
                           and t not in shots])
    if args.table is not None:
        verdicts = verdict_rows(args.table, None)
    elif args.judge:
        name = judge_corpus(args.judge, turns, args.verdicts, args.limit, shots)
        verdicts = verdict_rows(args.verdicts, name)
    else:
        parser.error("give --judge SPEC (to judge and print) or --table FILE")
    if args.same_turns_as is not None:
        other = verdict_rows(args.same_turns_as, None)
        verdicts = {key: row for key, row in verdicts.items() if key in other}
    groups = {g: sum(t.generator == g for t in turns) for g in GROUPS}
    print(f"corpus: {len(turns)} adjudicated turns ("
          + ", ".join(f"{g} {n}" for g, n in groups.items()) + f"); judged {len(verdicts)}")
    print("\n".join(table(turns, verdicts, args.bootstrap)))
    if args.calibrate:
        calibrated = out_of_source_verdicts(turns, verdicts)
        print(f"\ncalibrated (each source by a calibration fit on the others' train split, never "
              f"on people; {len(calibrated)} turns with log-probabilities)")
        print("\n".join(table(turns, calibrated, args.bootstrap)))
        if args.calibrated_verdicts is not None:
            args.calibrated_verdicts.write_text(
                "".join(json.dumps(row) + "\n" for row in calibrated.values()), encoding="utf-8")
            print(f"wrote {args.calibrated_verdicts}")
    if args.fit_calibration is not None:
        rows = [(t, r) for t, r in calibration_rows(turns, verdicts)
                if t.generator != "human" and t.example.split == "train"]
        if not rows:
            raise SystemExit("no train-split verdicts with log-probabilities to fit on")
        judge = rows[0][1]["judge"]
        fit = fit_calibration(rows, judge, f"{len(rows)} train-split turns of "
                              + ", ".join(sorted({t.generator for t, _ in rows})),
                              judge_revision(judge))
        fit.save(args.fit_calibration)
        print(f"wrote {args.fit_calibration}: {fit.fit_on}; use it with userturn run --judge "
              f"SPEC --judge-calibration {args.fit_calibration}")


if __name__ == "__main__":
    main()
