"""A run as an Inspect log (``.eval``), written with ``inspect_ai.log``'s own types and writer,
so ``inspect view`` opens it and ``inspect_ai.analysis.samples_df`` reads it.

One sample per generated user turn: the conversation as its messages with the generated user
turn last; the resolved label and every label source's label as scores; model, dataset,
temperature, perturbation, item and the rest of the turn's coordinates as metadata; the run's
follow-up rates (one per condition, with their 95% intervals) as the log's results.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from userturn import __version__
from userturn.errors import UserturnError
from userturn.integrations.optional import require
from userturn.report.summary import SummaryRow
from userturn.report.view import read_run
from userturn.store.atomic import refuse_to_replace, write_file
from userturn.store.database import RunStore
from userturn.store.meta import RunMeta
from userturn.store.turns import Turn

TASK = "userturn"
PURPOSE = "the Inspect log export"


def export_inspect(store: RunStore, out: Path, *, force: bool = False) -> int:
    """Write the run as an Inspect log at ``out`` (``.eval``, or ``.json`` for Inspect's JSON
    log format); returns the number of samples."""
    log_module = require("inspect_ai.log", PURPOSE)
    out = Path(out)
    if out.suffix not in (".eval", ".json"):
        raise UserturnError(f"{out}: an Inspect log is a .eval (or .json) file")
    refuse_to_replace(out, force)
    view = read_run(store)
    meta = view.meta
    samples = [_sample(turn, meta.config.get("system_prompt")) for turn in view.turns]
    log = log_module.EvalLog(
        status="success", eval=_spec(meta, view.turns, Path(store.folder)),
        results=log_module.EvalResults(total_samples=len(samples),
                                       completed_samples=len(samples),
                                       scores=[_score(row) for row in view.summary()]),
        stats=log_module.EvalStats(started_at=_when(meta.started),
                                   completed_at=_when(meta.finished)),
        samples=samples)

    def write(path: Path) -> None:
        # Inspect picks the log format by suffix: write beside the temporary name, keeping it.
        written = path.with_name(path.name + out.suffix)
        log_module.write_eval_log(log, str(written), format="auto")
        written.replace(path)

    write_file(out, write, force=force)  # whole under a temporary name, then renamed
    return len(samples)


def _spec(meta: RunMeta, turns: Sequence[Turn], folder: Path) -> Any:
    from inspect_ai.log import EvalConfig, EvalDataset, EvalSpec
    from inspect_ai.model import GenerateConfig

    config = meta.config
    models = sorted({t.model for t in turns}) or sorted(meta.models)
    datasets = sorted({t.dataset for t in turns})
    temperatures = sorted({t.temperature for t in turns})
    return EvalSpec(
        created=_when(meta.started) or datetime.now(timezone.utc).isoformat(),
        task=TASK, task_version=0,
        dataset=EvalDataset(name=", ".join(datasets), location=str(folder),
                            samples=len(turns)),
        # Inspect logs name one model: a run of several says so, and each sample names its own.
        model=models[0] if len(models) == 1 else f"userturn/{len(models)} models",
        model_generate_config=GenerateConfig(
            temperature=temperatures[0] if len(temperatures) == 1 else None,
            top_p=config.get("top_p"), max_tokens=config.get("user_max_tokens"),
            seed=config.get("seed")),
        config=EvalConfig(),
        metadata={"userturn_version": __version__, "run": str(folder), "models": models,
                  "datasets": datasets, "temperatures": temperatures,
                  "label_sources": meta.label_sources, "config": config,
                  "versions": meta.versions})


def _sample(turn: Turn, system: str | None) -> Any:
    from inspect_ai.log import EvalSample
    from inspect_ai.model import (
        ChatMessageAssistant,
        ChatMessageSystem,
        ChatMessageUser,
        ModelOutput,
    )

    kinds = {"system": ChatMessageSystem, "user": ChatMessageUser,
             "assistant": ChatMessageAssistant}
    *history, last = turn.conversation(system)
    conversation = [kinds[m["role"]](content=m["content"]) for m in history
                    if m["role"] in kinds]
    generated = ChatMessageUser(content=last["content"])
    output = ModelOutput.from_content(
        turn.model, turn.user_turn, stop_reason="max_tokens" if turn.finish_reason == "length"
        else "stop", error=turn.error)
    return EvalSample(
        id=turn.key, epoch=1, input=conversation, target="",
        messages=[*conversation, generated], output=output, scores=_scores(turn),
        metadata={"model": turn.model, "dataset": turn.dataset, "item_id": turn.item_id,
                  "temperature": turn.temperature, "sample_index": turn.sample_index,
                  "perturbation": turn.perturbation, "answerer": turn.answerer,
                  "context": turn.context, "answer_correct": turn.answer_correct,
                  "finish_reason": turn.finish_reason, "status": turn.status,
                  "thinking": turn.thinking, "raw_user_turn": turn.raw_user_turn,
                  "prompt": turn.prompt},
        error=None)


def _scores(turn: Turn) -> dict[str, Any]:
    """``label``: the resolved label (or why there is none); ``follow_up``: 1/0 for turns that
    count toward the rate; ``label:SOURCE`` for every source that labelled the turn."""
    from inspect_ai.scorer import Score

    scores = {"label": Score(value=turn.status, answer=turn.user_turn,
                             explanation=turn.rationale or turn.label_error or None,
                             metadata={"source": turn.label_source,
                                       "probability": turn.probability})}
    if turn.counts_toward_rate:
        scores["follow_up"] = Score(value=1.0 if turn.follow_up else 0.0)
    for lab in turn.labels:
        # A source that abstained is undecided; only one that failed (an error) is invalid.
        scores[f"label:{lab.source}"] = Score(
            value=turn.source_values(lab.source)[0] or "undecided",
            explanation=lab.rationale or lab.error or None,
            metadata={"version": lab.version, "probability": lab.probability})
    return scores


def _score(row: SummaryRow) -> Any:
    from inspect_ai.log import EvalMetric, EvalScore

    rate = row.follow_up
    condition = {"model": row.model, "dataset": row.dataset, "answerer": row.answerer,
                 "perturbation": row.perturbation, "temperature": row.temperature}
    metrics = {"follow_up_rate": rate.value, "ci_low": rate.low, "ci_high": rate.high,
               "follow_ups": rate.hits, "turns": rate.n, "undecided": row.undecided,
               "invalid": row.invalid, "failed": row.errors}
    name = (f"follow_up {row.model} {row.dataset} T={row.temperature:g}"
            + (f" {row.perturbation}" if row.perturbation != "none" else "")
            + (f" answerer={row.answerer}" if row.answerer != "self" else ""))
    return EvalScore(name=name, scorer=TASK, scored_samples=rate.n,
                     unscored_samples=row.invalid + row.errors, metadata=condition,
                     metrics={key: EvalMetric(name=key, value=_finite(value))
                              for key, value in metrics.items()})


def _finite(value: float) -> float:
    return 0.0 if isinstance(value, float) and math.isnan(value) else value


def _when(timestamp: float | None) -> str:
    if not timestamp:
        return ""
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat()
