"""A run, or the shipped labelled corpus, as a Hugging Face dataset folder in the hub's layout.

The folder is what the hub holds: the rows as Parquet under ``data/`` (one file per split) and a
``README.md`` dataset card whose YAML names the splits (``configs``), the columns and their types
(``dataset_info``), where the rows came from (models, datasets and each one's licence), who
labelled them, the run's rates with their intervals and the userturn version; its text says what
every column means. ``datasets.load_dataset(DIR)`` opens it, and ``hf upload NAME DIR
--repo-type dataset`` shares it as it is. Every export has one fixed schema (no column typed
``null`` because a run left it empty), so the exports of two runs concatenate.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from userturn.errors import StoreError
from userturn.integrations.folders import write_folder
from userturn.integrations.optional import require
from userturn.labels.corpus import CORPUS_FILE
from userturn.probe.plan import ProbePlan
from userturn.records import COLUMNS, Turn
from userturn.report.view import read_run
from userturn.stats.summary import SummaryRow
from userturn.store.database import RunStore
from userturn.store.meta import RunMeta
from userturn.version import __version__

# The licences of the sources userturn names itself (docs/datasets.md, docs/corpus.md). A local
# file or a hub model we do not know is "unknown": the card says so, and the sharer must fill it.
LICENCES = {
    "smollm2": "apache-2.0", "gsm_symbolic": "apache-2.0", "gsm8k": "mit",
    "openai/gsm8k": "mit", "ifeval": "apache-2.0", "ifbench": "apache-2.0", "math500": "mit",
    "mtbench": "apache-2.0",
}
# The corpus's own sources, as docs/corpus.md gives them: its math500 rows are reasoning-gym's
# MATH-style generators (Apache-2.0), not MATH-500; the conversations and reference answers are
# FastChat's (Apache-2.0); the second generator is the Qwen team's Apache-2.0 GGUF; the authored
# cases are userturn's own (its licence).
CORPUS_LICENCES = {
    **LICENCES, "math500": "apache-2.0", "dummy_conversation": "apache-2.0",
    "fastchat-dummy": "apache-2.0", "mtbench-reference": "apache-2.0", "authored": "apache-2.0",
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf": "apache-2.0", "human": "apache-2.0",
}
UNKNOWN = "unknown"

# Every column of a run's dataset: its type and what it means (the card lists them). One fixed
# schema whatever the run holds, so two runs' exports concatenate.
STRING, FLOAT, INT, BOOL = "string", "float64", "int64", "bool"
MESSAGE = {"role": STRING, "content": STRING}
SOURCE_LABEL = {"source": STRING, "version": STRING, "label": STRING, "probability": FLOAT,
                "rationale": STRING, "error": STRING}
RUN_COLUMNS: dict[str, tuple[Any, str]] = {
    "model": (STRING, "the probed model that wrote the user turn, its spec without the "
              "variants in the two columns after `arm` (`human`: the data's real next user "
              "turn)"),
    "arm": (STRING, "how the user turn was asked for: `opened` (the USER header opened) or "
            "`continuation` (the assistant's turn closed, the model went on)"),
    "user_variant": (STRING, "the user turn's opening the model was probed under: `native`, "
                     "or a variant such as `prefill:TEXT`, `system:none`, `warmup:K`"),
    "enable_thinking": (STRING, "the chat template's enable_thinking: `on`, `off`, or "
                        "`default` (the template's own)"),
    "answerer": (STRING, "who wrote the assistant answer: `self`, `reference`, `data` or a "
                 "model"),
    "dataset": (STRING, "the dataset of the item"),
    "perturbation": (STRING, "the change made to the answer before the turn (`none`: as "
                     "written)"),
    "temperature": (FLOAT, "the sampling temperature of the user turn (0: greedy)"),
    "sample_index": (INT, "which sample of the turn at this temperature (0, 1, ...)"),
    "item_id": (STRING, "the item's id in its dataset"),
    "context": (STRING, "the id of the conversation the turn was generated in (item, "
                "answerer, perturbation)"),
    "query": (STRING, "the last user message before the answer"),
    "answer": (STRING, "the assistant answer the turn follows, as shown to the model"),
    "answer_correct": (BOOL, "the task score of the answer (empty: not scored)"),
    "user_turn": (STRING, "the visible text of the generated user turn"),
    "raw_user_turn": (STRING, "the generated text with special tokens (and any thinking) "
                      "kept"),
    "thinking": (STRING, "a reasoning model's thinking, split off the turn (empty: none)"),
    "finish_reason": (STRING, "why generation stopped: `stop` (an end marker), `length` (the "
                      "token budget) or `error`"),
    "error": (STRING, "why the generation failed (empty: it did not)"),
    "label": (STRING, "the resolved label: the first decided label in the run's source "
              "order (empty: none decided)"),
    "label_source": (STRING, "the source that gave `label`"),
    "rationale": (STRING, "that source's reason for `label`"),
    "label_error": (STRING, "the first failed verdict of a source ranked above the one that "
                    "decided (a failed verdict never stands in for a label)"),
    "status": (STRING, "the label, or why there is none: `undecided`, `failed` or `no user "
               "turn` (a continuation that had another role speak)"),
    "next_role": (STRING, "what a continuation opened first: `user`, `assistant`, `system`, "
                  "`text` or `none` (empty: the opened arm)"),
    "prompt": (STRING, "the exact prompt the model continued (its chat template, the user "
               "turn opened)"),
    "key": (STRING, "the generation's key in the run store"),
    "messages": ([MESSAGE], "the whole conversation the turn was generated in (system, the "
                 "item's messages, the assistant answer), then the generated user turn"),
    "labels": ([SOURCE_LABEL], "every label source's label of the turn: source, version, "
               "label (empty: undecided, or a failed verdict with `error`), probability, "
               "rationale, error"),
}
assert list(RUN_COLUMNS)[:len(COLUMNS)] == list(COLUMNS)  # one column list, described here

CORPUS_COLUMNS: dict[str, tuple[Any, str]] = {
    "id": (STRING, "the turn's id in the corpus"),
    "query": (STRING, "the user query"),
    "answer": (STRING, "the assistant answer the turn follows"),
    "user_turn": (STRING, "the user turn that was labelled"),
    "label": (STRING, "the corpus label (docs/labels.md): both annotators', or the "
              "adjudicated one"),
    "annotator_a": (STRING, "annotator A's label"),
    "annotator_b": (STRING, "annotator B's label (empty: labelled once)"),
    "how": (STRING, "how the label was reached (agreed, adjudicated, ...)"),
    "kind": (STRING, "`generated` (a model wrote it), `human` (a person did) or `authored` "
             "(a hard case written for the corpus)"),
    "model": (STRING, "the model that wrote a generated turn"),
    "dataset": (STRING, "the dataset of the item"),
    "temperature": (FLOAT, "the sampling temperature of a generated turn"),
    "perturbation": (STRING, "the change made to the answer before the turn"),
    "source": (STRING, "the whole provenance of the turn, as JSON (it differs by kind)"),
}


def features(columns: Mapping[str, tuple[Any, str]]) -> Any:
    """The ``datasets.Features`` of ``columns`` (a list of records: a ``List`` of them)."""
    datasets = require("datasets", "the Hugging Face dataset export")

    def feature(kind: Any) -> Any:
        if isinstance(kind, list):
            return datasets.List({name: feature(sub) for name, sub in kind[0].items()})
        return datasets.Value(kind)

    return datasets.Features({name: feature(kind) for name, (kind, _) in columns.items()})


def _card_features(columns: Mapping[str, tuple[Any, str]]) -> list[dict[str, Any]]:
    """``dataset_info.features`` as the hub's card YAML writes them."""
    def one(name: str, kind: Any) -> dict[str, Any]:
        if isinstance(kind, list):
            return {"name": name, "list": [one(sub, k) for sub, k in kind[0].items()]}
        return {"name": name, "dtype": kind}

    return [one(name, kind) for name, (kind, _) in columns.items()]


def _column_table(columns: Mapping[str, tuple[Any, str]]) -> list[str]:
    def shown(kind: Any) -> str:
        return f"list of {{{', '.join(kind[0])}}}" if isinstance(kind, list) else kind

    return ["| column | type | meaning |", "|---|---|---|",
            *[f"| `{name}` | {shown(kind)} | {text} |" for name, (kind, text) in columns.items()]]


def _card_data(columns: Mapping[str, tuple[Any, str]], splits: Mapping[str, Any]
               ) -> dict[str, Any]:
    """The card's ``configs`` and ``dataset_info`` for ``splits`` (name -> ``datasets.Dataset``).
    Each split names its rows and its Arrow bytes: ``datasets`` reads a split without
    ``num_bytes`` as malformed, warns, and drops the split sizes it checks the rows against."""
    sizes = {split: table.data.nbytes for split, table in splits.items()}
    return {
        "configs": [{"config_name": "default",
                     "data_files": [{"split": split, "path": f"data/{split}-*.parquet"}
                                    for split in splits]}],
        "dataset_info": {"features": _card_features(columns),
                         "splits": [{"name": split, "num_bytes": sizes[split],
                                     "num_examples": table.num_rows}
                                    for split, table in splits.items()],
                         "dataset_size": sum(sizes.values())},
    }


def _write_splits(folder: Path, splits: Mapping[str, Any]) -> None:
    """The hub's layout: ``data/SPLIT-00000-of-00001.parquet`` per split."""
    (folder / "data").mkdir()
    for split, table in splits.items():
        table.to_parquet(str(folder / "data" / f"{split}-00000-of-00001.parquet"))


def export_run(store: RunStore, out: Path, *, force: bool = False) -> int:
    """Write the run's user turns (one row each, with every label source) as a dataset folder
    with its card; returns the number of rows. A run with no user turns is refused: a split
    with no rows is one ``datasets.load_dataset`` cannot open."""
    datasets = require("datasets", "the Hugging Face dataset export")
    view = read_run(store)
    if not view.turns:
        raise StoreError(f"{store.folder} holds no user turns: nothing to export as a dataset "
                         f"(`userturn report {store.folder}` says where the run stopped)")
    plan = view.meta.stored(ProbePlan)  # read once for every row and the card
    rows = [turn_row(turn, plan.system_prompt) for turn in view.turns]
    splits = {"train": datasets.Dataset.from_list(rows, features=features(RUN_COLUMNS))}
    card = run_card(view.meta, plan, view.turns, view.summary(), Path(store.folder).name,
                    splits)

    def build(folder: Path) -> None:
        _write_splits(folder, splits)
        (folder / "README.md").write_text(card, encoding="utf-8")

    write_folder(out, build, force=force)
    return len(rows)


def turn_row(turn: Turn, system: str | None = None) -> dict[str, Any]:
    """The export's columns, the conversation with the generated turn last, and every
    source's label (the resolved one is ``label``; ``labels`` keeps them all, so a reader can
    choose another source)."""
    return {**turn.record(), "messages": turn.conversation(system),
            "labels": [{"source": lab.source, "version": lab.version, "label": lab.label,
                        "probability": lab.probability, "rationale": lab.rationale,
                        "error": lab.error} for lab in turn.labels]}


def run_card(meta: RunMeta, plan: ProbePlan, turns: Sequence[Turn],
             summary: Sequence[SummaryRow], name: str, splits: Mapping[str, Any]) -> str:
    """The run's card; ``splits``: its ``datasets.Dataset`` by split name."""
    models = sorted({t.model for t in turns} or set(meta.models))
    datasets = sorted({t.dataset for t in turns})
    sources = sorted({lab.source for t in turns for lab in t.labels})
    revisions = {spec: info.revision or None for spec, info in meta.models.items()}
    header = {
        "pretty_name": f"userturn run {name}",
        "license": _licence([*models, *datasets]),
        "description": f"User turns written by {', '.join(map(public_name, models))} with the "
                       "user-turn generation probe (userturn), labelled.",
        "tags": ["userturn", "user-turn-probe"],
        "task_categories": ["text-generation"],
        "size_categories": [_size(len(turns))],
        "source_datasets": datasets,
        **_card_data(RUN_COLUMNS, splits),
        "userturn": {
            "version": __version__,
            "models": [{"name": public_name(m), "revision": revisions.get(m),
                        "license": _licence([m])} for m in models],
            "datasets": [{"name": d, "license": _licence([d])} for d in datasets],
            "label_sources": sources,
            "label_order": meta.label_sources,
            "decoding": {"temperatures": plan.temperatures, "top_p": plan.top_p,
                         "user_max_tokens": plan.user_max_tokens},
            "rates": [_rate(row) for row in summary],
        },
    }
    lines = [f"| {r.probed} | {r.dataset} | {r.answerer} | {r.perturbation} | {r.temperature:g} "
             f"| {r.follow_up.hits}/{r.follow_up.n} | {_pct(r.follow_up.value)} "
             f"[{_pct(r.follow_up.low)}, {_pct(r.follow_up.high)}] |" for r in summary]
    body = "\n".join([
        f"# userturn run {name}", "",
        f"{len(turns)} user turns written by {', '.join(map(public_name, models)) or 'no model'}"
        " with the "
        "user-turn generation probe (userturn): after a user query and an assistant answer, a "
        "USER turn is opened in the model's own chat template and the model writes it. Each "
        "row is one generated user turn with its conversation, its labels from every source "
        f"({', '.join(sources) or 'none'}) and the resolved `label`.", "",
        "| model | dataset | answerer | perturbation | temperature | follow-ups | rate [95% CI] |",
        "|---|---|---|---|---|---|---|", *lines, "",
        "The rate is over labelled and undecided turns, with a 95% Wilson interval clustered by "
        "item. Licences marked `unknown` are of sources userturn does not know (a local file, a "
        "hub model): state them before sharing.", "",
        "Open it with `datasets.load_dataset(\"FOLDER\")` (the split `train`).", "",
        "## Columns", "", *_column_table(RUN_COLUMNS), ""])
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
            "kind": source.get("kind"),
            "model": public_name(source["model"]) if source.get("model") else None,
            "dataset": source.get("dataset"), "temperature": source.get("temperature"),
            "perturbation": source.get("perturbation"),
            # The rest of the provenance differs by kind (an authored case's intended label):
            # one JSON column keeps every field without a sparse schema.
            "source": json.dumps({**source, **({"model": public_name(source["model"])}
                                               if source.get("model") else {})},
                                 sort_keys=True)})
    counts = {split: len(rows) for split, rows in sorted(splits.items())}
    tables = {split: datasets.Dataset.from_list(rows, features=features(CORPUS_COLUMNS))
              for split, rows in sorted(splits.items())}
    card = corpus_card(splits, tables)

    def build(folder: Path) -> None:
        _write_splits(folder, tables)
        (folder / "README.md").write_text(card, encoding="utf-8")

    write_folder(out, build, force=force)
    return counts


def corpus_card(splits: Mapping[str, Sequence[Mapping[str, Any]]],
                tables: Mapping[str, Any]) -> str:
    """The corpus's card: ``splits`` its rows, ``tables`` the same as ``datasets.Dataset``."""
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
        # One licence where every source has it (docs/corpus.md), else "other" or "unknown".
        "license": _licence([*models, *datasets], CORPUS_LICENCES),
        "description": "User turns after an assistant answer, each labelled by two blind "
                       "annotators and adjudicated where they disagreed (userturn's label "
                       "set).",
        "tags": ["userturn", "user-turn-probe"],
        "task_categories": ["text-classification"],
        "size_categories": [_size(len(rows))],
        "source_datasets": datasets,
        **_card_data(CORPUS_COLUMNS, tables),
        "userturn": {
            "version": __version__,
            "models": [{"name": m, "license": _licence([m], CORPUS_LICENCES)} for m in models],
            "datasets": [{"name": d, "license": _licence([d], CORPUS_LICENCES)}
                         for d in datasets],
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
        + ", ".join(f"{split} {len(part)}" for split, part in sorted(splits.items())) + ". "
        "`datasets.load_dataset(\"FOLDER\")` keeps the split names (`dev` stays `dev`).", "",
        "Licences per source (docs/corpus.md): " + "; ".join(
            f"{name} {_licence([name], CORPUS_LICENCES)}" for name in [*models, *datasets])
        + ".", "", "## Columns", "", *_column_table(CORPUS_COLUMNS), ""])
    return _card(header, body)


def read_card(path: Path) -> dict[str, Any]:
    """The YAML header of a dataset card (README.md), as the hub reads it."""
    text = Path(path).read_text(encoding="utf-8")
    _, header, _ = text.split("---\n", 2)
    return yaml.safe_load(header)


def _card(header: Mapping[str, Any], body: str) -> str:
    return f"---\n{yaml.safe_dump(dict(header), sort_keys=False, allow_unicode=True)}---\n\n{body}"


def public_name(model: str) -> str:
    """A model as a card may name it: a local file or folder by its last part
    (``llamacpp/corpus/work/qwen...gguf`` -> ``llamacpp/qwen...gguf``), never the path on the
    machine that made the rows; a hub id or an embedded name as it is."""
    backend, _, rest = model.partition("/")
    if backend in ("transformers", "vllm", "llamacpp") and rest:
        return f"{backend}/{public_name(rest)}"
    if model.startswith(("/", ".", "~")) or model.count("/") > 1 or re.search(
            r"\.(gguf|bin|safetensors)$", model):
        return Path(model).name
    return model


def _licence(names: Sequence[str], known: Mapping[str, str] = LICENCES) -> str:
    """One licence id where every source shares it; ``other`` where they differ or one is
    unknown (the card's ``userturn`` block names each)."""
    found = {known.get(_short(public_name(name)), UNKNOWN) for name in names}
    return found.pop() if len(found) == 1 and UNKNOWN not in found else (
        UNKNOWN if found == {UNKNOWN} else "other")


def _short(name: str) -> str:
    """``transformers/smollm2`` and ``smollm2`` are the same model; a file's dataset by its name."""
    return name.split("/", 1)[1] if name.startswith(("transformers/", "vllm/", "llamacpp/")) \
        else name


def _rate(row: SummaryRow) -> dict[str, Any]:
    rate = row.follow_up
    return {"model": row.model, "arm": row.arm, "user_variant": row.user_variant,
            "enable_thinking": row.enable_thinking, "dataset": row.dataset, "answerer": row.answerer,
            "perturbation": row.perturbation, "temperature": row.temperature,
            "follow_up_rate": _number(rate.value), "ci_low": _number(rate.low),
            "ci_high": _number(rate.high), "follow_ups": rate.hits, "turns": rate.n,
            "undecided": row.undecided, "label_errors": row.label_errors,
            "failed": row.errors}


def _number(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 6)


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.1f}%"


def _size(n: int) -> str:
    for limit, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K")):
        if n < limit:
            return name
    return "100K<n<1M"
