"""Before/after: the probe on the base model and on the checkpoint, then ``userturn compare``.

Both runs probe the same held-out items (the split's evaluation items) with the same seeds and
decoding, so the comparison is paired item by item. The training signal came from the rules
classifier (rejection sampling for SFT's self data, the reward for ``rl --reward probe|collab``),
and a model trained on a metric can learn to please that metric: the effect is therefore also
measured by labellers that played no part in training: the held-out rule set
(``train.heldout``, always) and the judge when one is given (``--judge``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from userturn.data import Dataset
from userturn.labels.sources import LABELLERS, judge_sources
from userturn.labels.stages import label_with
from userturn.probe.pipeline import run_experiment
from userturn.records import Progress
from userturn.report.compare import compare_runs, comparison_html
from userturn.stats.comparison import AccuracyComparison, Comparison
from userturn.train.heldout import HeldOutRules
from userturn.train.settings import TrainSettings

GAMING_NOTE = ("The training signal came from the offline cascade, the rules then the learned "
               "classifier ({how}). Follow-up rates measured by the same cascade can rise "
               "because the model learned what the cascade "
               "reward rather than to follow up; read them beside the labellers that played no "
               "part in training{other}.")


@dataclass
class BeforeAfter:
    base_run: Path
    tuned_run: Path
    by_labeller: dict[str, tuple[list[Comparison], list[AccuracyComparison]]]
    note: str


def before_after(settings: TrainSettings, held_out: Dataset, checkpoint: Path, *,
                 how: str | None,
                 progress: Progress | None = None) -> BeforeAfter:
    out = settings.training.output
    runs = {}
    for name, model in (("eval-base", settings.training.model), ("eval-tuned", str(checkpoint))):
        exp = settings.experiment(model, held_out.name, out / name,
                                  limit=settings.training.eval_items, judge=True)
        runs[name] = run_experiment(exp, progress=progress, datasets=[held_out])
    base, tuned = runs["eval-base"], runs["eval-tuned"]
    heldout = HeldOutRules()
    for store, model in ((base, settings.training.model), (tuned, str(checkpoint))):
        label_with(store, [heldout], {model: _assistant_header(model)})
    labellers: dict[str, list[str]] = {"cascade": LABELLERS["cascade"].sources(),
                                       f"{heldout.name} (played no part in training)":
                                       [heldout.name]}
    judged = judge_sources(tuned.label_sources())
    if judged:
        labellers[f"{judged[0]} (played no part in training)"] = judged[:1]
    other = (f": the held-out rule set and {judged[0]}" if judged else
             ": here the held-out rule set, a coarse one; add a judge with `--judge`, or later "
             "with `userturn judge` on both runs and `userturn compare --labels JUDGE`")
    note = (GAMING_NOTE.format(how=how, other=other) if how else
            "The offline cascade played no part in training (the data came from a file).")
    by_labeller = {name: compare_runs(base, tuned, labels=sources)
                   for name, sources in labellers.items()}
    names = (f"{settings.training.model} (base)", f"{checkpoint} (trained)")
    for index, (name, (comparisons, accuracy)) in enumerate(by_labeller.items()):
        page = out / ("before_after.html" if index == 0 else f"before_after.{index}.html")
        page.write_text(comparison_html(comparisons, accuracy, names,
                                        note=f"Labels: {name}.\n{note}"), encoding="utf-8")
    base.close()
    tuned.close()
    return BeforeAfter(out / "eval-base", out / "eval-tuned", by_labeller, note)


def _assistant_header(model: str) -> str:
    from userturn.backends import load_template
    from userturn.chat.render import derive_markers

    return derive_markers(load_template(model)).assistant_header.strip()


def summary_rows(result: BeforeAfter) -> list[dict[str, Any]]:
    """The before/after figures as plain rows, for the manifest."""
    rows = []
    for labeller, (comparisons, accuracy) in result.by_labeller.items():
        for c in comparisons:
            d = c.follow_up
            rows.append({"labeller": labeller, "measure": "follow_up_rate",
                         "temperature": c.temperature, "perturbation": c.perturbation,
                         "items": d.items, "base": d.a.value, "trained": d.b.value,
                         "difference": d.delta, "low": d.low, "high": d.high})
        for c in accuracy if labeller == "cascade" else []:
            d = c.accuracy
            rows.append({"labeller": "-", "measure": "accuracy", "temperature": 0.0,
                         "perturbation": "none", "items": d.items, "base": d.a.value,
                         "trained": d.b.value, "difference": d.delta, "low": d.low,
                         "high": d.high})
    return rows
