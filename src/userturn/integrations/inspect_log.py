"""A run as an Inspect log (``.eval``), written with ``inspect_ai.log``'s own types and writer,
so ``inspect view`` opens it and ``inspect_ai.analysis.samples_df`` reads it.

Laid out as an Inspect eval scored with ``userturn.inspect.user_turn_label`` would be: one
sample per generated user turn, the conversation as its messages with the generated user turn
last, and ONE score, ``user_turn_label``, whose value is the resolved label (every label
source's label in its metadata); the condition (model, dataset, temperature, perturbation,
answerer, and ``condition``, their one-word id) and the turn's other coordinates as the sample's
metadata; the aggregates as that score's metrics: the follow-up rate of every turn pooled
(``follow_up_rate``, the headline, with ``ci_low``/``ci_high`` clustered by item and the
counts), then one metric per condition named by its id in the group ``follow_up_rate``, as
``grouped(follow_up_rate(), "condition")`` reports it, its interval and counts in the metric's
metadata.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

from userturn.errors import UserturnError
from userturn.integrations.optional import require
from userturn.probe.plan import ProbePlan
from userturn.records import Turn
from userturn.report.view import read_run
from userturn.stats.rates import clustered_rate
from userturn.stats.summary import SummaryRow
from userturn.store.atomic import refuse_to_replace, write_file
from userturn.store.database import RunStore
from userturn.store.meta import RunMeta
from userturn.version import __version__

TASK = "userturn"
SCORER = "user_turn_label"  # the name of userturn.inspect's scorer: a live eval's score
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
    tokens = {key: (row.generation.prompt_tokens or 0, row.generation.completion_tokens or 0)
              for key, row in store.generations([turn.key for turn in view.turns]).items()}
    plan = meta.stored(ProbePlan)  # read once for the whole log
    samples = [_sample(turn, plan.system_prompt, tokens.get(turn.key)) for turn in view.turns]
    log = log_module.EvalLog(
        status="success", eval=_spec(meta, plan, view.turns, Path(store.folder)),
        results=log_module.EvalResults(
            total_samples=len(samples), completed_samples=len(samples),
            scores=[_results(view.turns, view.summary())]),
        stats=log_module.EvalStats(started_at=_when(meta.started),
                                   completed_at=_when(meta.finished),
                                   model_usage=_usage(view.turns, tokens)),
        samples=samples)

    def write(path: Path) -> None:
        # Inspect picks the log format by suffix: write beside the temporary name, keeping it.
        written = path.with_name(path.name + out.suffix)
        log_module.write_eval_log(log, str(written), format="auto")
        written.replace(path)

    write_file(out, write, force=force)  # whole under a temporary name, then renamed
    return len(samples)


def _spec(meta: RunMeta, plan: ProbePlan, turns: Sequence[Turn], folder: Path) -> Any:
    from inspect_ai.log import EvalConfig, EvalDataset, EvalSpec
    from inspect_ai.model import GenerateConfig

    models = sorted({t.model for t in turns}) or sorted(meta.models)
    datasets = sorted({t.dataset for t in turns})
    temperatures = sorted({t.temperature for t in turns})
    # Stable ids: the same run exported twice is the same run and task in Inspect's tables.
    run_id = _id(str(folder.resolve()), meta.started)
    return EvalSpec(
        created=_when(meta.started) or datetime.now(timezone.utc).isoformat(),
        run_id=run_id, task_id=_id(run_id, TASK),
        task=TASK, task_version=0,
        dataset=EvalDataset(name=", ".join(datasets), location=str(folder),
                            samples=len(turns)),
        # Inspect logs name one model: a run of several says so, and each sample names its own.
        model=models[0] if len(models) == 1 else f"userturn/{len(models)} models",
        model_generate_config=GenerateConfig(
            temperature=temperatures[0] if len(temperatures) == 1 else None,
            top_p=plan.top_p, max_tokens=plan.user_max_tokens, seed=plan.seed),
        config=EvalConfig(),
        metadata={"userturn_version": __version__, "run": str(folder), "models": models,
                  "datasets": datasets, "temperatures": temperatures,
                  "label_sources": meta.label_sources, "config": meta.config,
                  "versions": meta.versions})


def _id(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:22]


def _usage(turns: Sequence[Turn], tokens: Mapping[str, tuple[int, int]]) -> dict[str, Any]:
    """Tokens of the user turns per model, as the store counted them."""
    from inspect_ai.model import ModelUsage

    totals: dict[str, list[int]] = {}
    for turn in turns:
        sent, written = tokens.get(turn.key, (0, 0))
        total = totals.setdefault(turn.probed, [0, 0])
        total[0], total[1] = total[0] + sent, total[1] + written
    return {model: ModelUsage(input_tokens=sent, output_tokens=written,
                              total_tokens=sent + written)
            for model, (sent, written) in totals.items()}


def _sample(turn: Turn, system: str | None, tokens: tuple[int, int] | None) -> Any:
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
        turn.probed, turn.user_turn, stop_reason="max_tokens" if turn.finish_reason == "length"
        else "stop", error=turn.error)
    usage = _usage([turn], {turn.key: tokens}) if tokens else {}
    output.usage = usage.get(turn.probed)
    return EvalSample(
        model_usage=usage,
        id=turn.key, epoch=1, input=conversation, target="",
        messages=[*conversation, generated], output=output, scores={SCORER: _score(turn)},
        metadata={"condition": condition_id(turn.probed, turn.dataset, turn.temperature,
                                            turn.perturbation, turn.answerer, turn.arm),
                  "model": turn.model, "arm": turn.arm, "user_variant": turn.user_variant,
                  "enable_thinking": turn.enable_thinking, "next_role": turn.next_role,
                  "dataset": turn.dataset, "item_id": turn.item_id,
                  "temperature": turn.temperature, "sample_index": turn.sample_index,
                  "perturbation": turn.perturbation, "answerer": turn.answerer,
                  "context": turn.context, "answer_correct": turn.answer_correct,
                  "finish_reason": turn.finish_reason, "status": turn.status,
                  "thinking": turn.thinking, "raw_user_turn": turn.raw_user_turn,
                  "prompt": turn.prompt},
        error=None)


def _score(turn: Turn) -> Any:
    """The turn's one score, as ``user_turn_label`` gives it: the resolved label (or why there
    is none) as its value, and in its metadata who decided, whether it counts toward the rate
    as a follow-up (1/0; None: it does not count), and every source's label (``undecided``
    where a source abstained, ``error`` where its verdict failed)."""
    from inspect_ai.scorer import Score

    return Score(value=turn.status, answer=turn.user_turn,
                 explanation=turn.rationale or turn.label_error or None,
                 metadata={"label": turn.status, "source": turn.label_source,
                           "probability": turn.probability,
                           "follow_up": (1.0 if turn.follow_up else 0.0)
                           if turn.counts_toward_rate else None,
                           "labels": {lab.source: turn.source_values(lab.source)[0]
                                      or "undecided" for lab in turn.labels}})


def condition_id(model: str, dataset: str, temperature: float, perturbation: str,
                 answerer: str, arm: str = "opened") -> str:
    """A condition in one word, as Inspect's tables name a metric's column:
    ``smollm2_gsm_symbolic_t0_7`` (then the perturbation, answerer and arm where set)."""
    parts = [model, dataset, f"t{temperature:g}",
             *([perturbation] if perturbation != "none" else []),
             *([f"answerer {answerer}"] if answerer != "self" else []),
             *([arm] if arm != "opened" else [])]
    return "_".join(re.sub(r"[^A-Za-z0-9]+", "_", part).strip("_") for part in parts)


def _results(turns: Sequence[Turn], rows: Sequence[SummaryRow]) -> Any:
    """The one score's metrics: the run pooled (the headline: Inspect shows the first metric
    of the first score), then each condition's rate, grouped as ``grouped()`` groups them."""
    from inspect_ai.log import EvalMetric, EvalScore

    counted = [t for t in turns if t.counts_toward_rate]
    rate = clustered_rate(((t.dataset, t.item_id), t.follow_up) for t in counted)
    pooled = {"follow_up_rate": rate.value, "ci_low": rate.low, "ci_high": rate.high,
              "follow_ups": rate.hits, "turns": rate.n}
    metrics = {key: EvalMetric(name=key, value=_finite(value)) for key, value in pooled.items()}
    for row in rows:
        key = condition_id(row.probed, row.dataset, row.temperature, row.perturbation,
                           row.answerer, row.arm)
        metrics[key] = EvalMetric(
            name=key, group="follow_up_rate", value=_finite(row.follow_up.value),
            metadata={"model": row.model, "arm": row.arm, "user_variant": row.user_variant,
                      "enable_thinking": row.enable_thinking, "dataset": row.dataset,
                      "answerer": row.answerer, "perturbation": row.perturbation,
                      "temperature": row.temperature, "ci_low": _finite(row.follow_up.low),
                      "ci_high": _finite(row.follow_up.high),
                      "follow_ups": row.follow_up.hits, "turns": row.follow_up.n,
                      "undecided": row.undecided, "label_errors": row.label_errors,
                      "failed": row.errors})
    return EvalScore(name=SCORER, scorer=SCORER, scored_samples=rate.n,
                     unscored_samples=len(turns) - len(counted), metrics=metrics)


def _finite(value: float) -> float:
    return 0.0 if isinstance(value, float) and math.isnan(value) else value


def _when(timestamp: float | None) -> str:
    if not timestamp:
        return ""
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat()
