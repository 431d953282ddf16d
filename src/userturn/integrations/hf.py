"""A run, or the shipped labelled corpus, as a Hugging Face dataset folder.

The folder opens with ``datasets.load_from_disk(DIR)`` (the Arrow files ``save_to_disk``
writes) and with ``load_dataset("parquet", data_dir=DIR + "/data")``; its ``README.md`` is a
dataset card whose YAML says where the rows came from (models, datasets and their licences), who
labelled them, the run's rates with their intervals and the userturn version. A user who is
online shares it with ``huggingface-cli upload NAME DIR --repo-type dataset`` or
``load_from_disk(DIR).push_to_hub(NAME)``: the card's ``configs`` point the hub at the Parquet
files.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from userturn import __version__
from userturn.integrations.folders import write_folder
from userturn.integrations.optional import require
from userturn.labels.corpus import CORPUS_FILE
from userturn.report.summary import SummaryRow
from userturn.report.view import read_run
from userturn.store.database import RunStore
from userturn.store.meta import RunMeta
from userturn.store.turns import COLUMNS, Turn

# The licences of the sources userturn names itself (docs/datasets.md, docs/corpus.md). A local
# file or a hub model we do not know is "unknown": the card says so, and the sharer must fill it.
LICENCES = {
    "smollm2": "apache-2.0", "gsm_symbolic": "apache-2.0", "gsm8k": "mit",
    "openai/gsm8k": "mit", "ifeval": "apache-2.0", "ifbench": "apache-2.0", "math500": "mit",
    "mtbench": "apache-2.0",
}
UNKNOWN = "unknown"


def export_run(store: RunStore, out: Path, *, force: bool = False) -> int:
    """Write the run's user turns (one row each, with every label source) as a dataset folder
    with its card; returns the number of rows."""
    datasets = require("datasets", "the Hugging Face dataset export")
    view = read_run(store)
    rows = [turn_row(turn) for turn in view.turns]
    card = run_card(view.meta, view.turns, view.summary(), Path(store.folder).name)

    def build(folder: Path) -> None:
        table = datasets.Dataset.from_list(rows) if rows else datasets.Dataset.from_dict(
            {name: [] for name in turn_columns()})
        table.save_to_disk(str(folder))
        (folder / "data").mkdir()
        table.to_parquet(str(folder / "data" / "train-00000-of-00001.parquet"))
        (folder / "README.md").write_text(card, encoding="utf-8")

    write_folder(out, build, force=force)
    return len(rows)


def turn_columns() -> list[str]:
    return [*COLUMNS, "messages", "labels"]


def turn_row(turn: Turn) -> dict[str, Any]:
    """The export's columns, the conversation, and every source's label (the resolved one is
    ``label``; ``labels`` keeps them all, so a reader can choose another source)."""
    return {**turn.record(),
            "messages": [{"role": m["role"], "content": m["content"]} for m in turn.messages],
            "labels": [{"source": lab.source, "version": lab.version, "label": lab.label,
                        "probability": lab.probability, "rationale": lab.rationale,
                        "error": lab.error} for lab in turn.labels]}


def run_card(meta: RunMeta, turns: Sequence[Turn], summary: Sequence[SummaryRow],
             name: str) -> str:
    models = sorted({t.model for t in turns} or set(meta.models))
    datasets = sorted({t.dataset for t in turns})
    sources = sorted({lab.source for t in turns for lab in t.labels})
    revisions = {spec: info.revision or None for spec, info in meta.models.items()}
    config = meta.config
    header = {
        "pretty_name": f"userturn run {name}",
        "license": _licence([*models, *datasets]),
        "tags": ["userturn", "user-turn-probe"],
        "task_categories": ["text-generation"],
        "size_categories": [_size(len(turns))],
        "source_datasets": datasets,
        "configs": [{"config_name": "default",
                     "data_files": [{"split": "train", "path": "data/*.parquet"}]}],
        "userturn": {
            "version": __version__,
            "models": [{"name": m, "revision": revisions.get(m), "license": _licence([m])}
                       for m in models],
            "datasets": [{"name": d, "license": _licence([d])} for d in datasets],
            "label_sources": sources,
            "label_order": meta.label_sources,
            "decoding": {"temperatures": config.get("temperatures"),
                         "top_p": config.get("top_p"),
                         "user_max_tokens": config.get("user_max_tokens")},
            "rates": [_rate(row) for row in summary],
        },
    }
    lines = [f"| {r.model} | {r.dataset} | {r.answerer} | {r.perturbation} | {r.temperature:g} "
             f"| {r.follow_up.hits}/{r.follow_up.n} | {_pct(r.follow_up.value)} "
             f"[{_pct(r.follow_up.low)}, {_pct(r.follow_up.high)}] |" for r in summary]
    body = "\n".join([
        f"# userturn run {name}", "",
        f"{len(turns)} user turns written by {', '.join(models) or 'no model'} with the "
        "user-turn generation probe (userturn): after a user query and an assistant answer, a "
        "USER turn is opened in the model's own chat template and the model writes it. Each "
        "row is one generated user turn with its conversation, its labels from every source "
        f"({', '.join(sources) or 'none'}) and the resolved `label`.", "",
        "| model | dataset | answerer | perturbation | temperature | follow-ups | rate [95% CI] |",
        "|---|---|---|---|---|---|---|", *lines, "",
        "The rate is over labelled and undecided turns, with a 95% Wilson interval clustered by "
        "item. Licences marked `unknown` are of sources userturn does not know (a local file, a "
        "hub model): state them before sharing.", ""])
    return _card(header, body)


def export_corpus(out: Path, *, force: bool = False, path: Path = CORPUS_FILE) -> dict[str, int]:
    """The shipped labelled corpus as a dataset folder: one split per corpus split (train, dev,
    test), with its card. Returns rows per split."""
    datasets = require("datasets", "the Hugging Face dataset export")
    from userturn.labels.training import read_rows

    splits: dict[str, list[dict[str, Any]]] = {}
    for _, row in read_rows(path):
        source = row.get("source") or {}
        splits.setdefault(row["split"], []).append({
            "id": row["id"], "query": row["query"], "answer": row["answer"],
            "user_turn": row["user_turn"], "label": row["label"],
            "annotator_a": row.get("annotations", {}).get("A"),
            "annotator_b": row.get("annotations", {}).get("B"), "how": row.get("how"),
            "kind": source.get("kind"), "model": source.get("model"),
            "dataset": source.get("dataset"), "temperature": source.get("temperature"),
            "perturbation": source.get("perturbation"),
            # The rest of the provenance differs by kind (an authored case's intended label):
            # one JSON column keeps every field without a sparse schema.
            "source": json.dumps(source, sort_keys=True)})
    counts = {split: len(rows) for split, rows in sorted(splits.items())}

    def build(folder: Path) -> None:
        table = datasets.DatasetDict({split: datasets.Dataset.from_list(rows)
                                      for split, rows in sorted(splits.items())})
        table.save_to_disk(str(folder))
        (folder / "data").mkdir()
        for split, part in table.items():
            part.to_parquet(str(folder / "data" / f"{split}-00000-of-00001.parquet"))
        (folder / "README.md").write_text(corpus_card(splits), encoding="utf-8")

    write_folder(out, build, force=force)
    return counts


def corpus_card(splits: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    rows = [row for part in splits.values() for row in part]
    labels: dict[str, dict[str, int]] = {}
    for split, part in splits.items():
        for row in part:
            labels.setdefault(row["label"], {}).setdefault(split, 0)
            labels[row["label"]][split] += 1
    models = sorted({r["model"] for r in rows if r["model"] and r["kind"] == "generated"})
    datasets = sorted({r["dataset"] for r in rows if r["dataset"]})
    header = {
        "pretty_name": "userturn labelled user turns",
        # Every source is Apache-2.0 (docs/corpus.md); the authored cases are userturn's own.
        "license": "apache-2.0",
        "tags": ["userturn", "user-turn-probe"],
        "task_categories": ["text-classification"],
        "size_categories": [_size(len(rows))],
        "source_datasets": datasets,
        "configs": [{"config_name": "default",
                     "data_files": [{"split": split, "path": f"data/{split}-*.parquet"}
                                    for split in sorted(splits)]}],
        "userturn": {
            "version": __version__,
            "models": [{"name": m, "license": _licence([m])} for m in models],
            "datasets": [{"name": d, "license": _licence([d])} for d in datasets],
            "label_sources": ["annotator A", "annotator B", "adjudicator"],
            "labels": {label: dict(sorted(by_split.items()))
                       for label, by_split in sorted(labels.items())},
        },
    }
    body = "\n".join([
        "# userturn labelled user turns", "",
        f"{len(rows)} distinct user turns with the query and the assistant answer they follow, "
        "each labelled by two blind annotators and adjudicated where they disagreed (the label "
        "set of userturn's docs/labels.md; how the corpus was made: docs/corpus.md). Splits: "
        + ", ".join(f"{split} {len(part)}" for split, part in sorted(splits.items())) + ".", ""])
    return _card(header, body)


def read_card(path: Path) -> dict[str, Any]:
    """The YAML header of a dataset card (README.md), as the hub reads it."""
    text = Path(path).read_text(encoding="utf-8")
    _, header, _ = text.split("---\n", 2)
    return yaml.safe_load(header)


def _card(header: Mapping[str, Any], body: str) -> str:
    return f"---\n{yaml.safe_dump(dict(header), sort_keys=False, allow_unicode=True)}---\n\n{body}"


def _licence(names: Sequence[str]) -> str:
    """One licence id where every source shares it; ``other`` where they differ or one is
    unknown (the card's ``userturn`` block names each)."""
    found = {LICENCES.get(_short(name), UNKNOWN) for name in names}
    return found.pop() if len(found) == 1 and UNKNOWN not in found else (
        UNKNOWN if found == {UNKNOWN} else "other")


def _short(name: str) -> str:
    """``transformers/smollm2`` and ``smollm2`` are the same model; a file's dataset by its name."""
    return name.split("/", 1)[1] if name.startswith(("transformers/", "vllm/", "llamacpp/")) \
        else name


def _rate(row: SummaryRow) -> dict[str, Any]:
    rate = row.follow_up
    return {"model": row.model, "dataset": row.dataset, "answerer": row.answerer,
            "perturbation": row.perturbation, "temperature": row.temperature,
            "follow_up_rate": _number(rate.value), "ci_low": _number(rate.low),
            "ci_high": _number(rate.high), "follow_ups": rate.hits, "turns": rate.n,
            "undecided": row.undecided, "invalid": row.invalid, "failed": row.errors}


def _number(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 6)


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.1f}%"


def _size(n: int) -> str:
    for limit, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K")):
        if n < limit:
            return name
    return "100K<n<1M"
