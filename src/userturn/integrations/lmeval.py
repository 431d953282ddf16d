"""The user-turn pass as an lm-evaluation-harness task, and its samples back into a run folder.

``export_task`` writes a folder that ``lm-eval run --include_path DIR --tasks TASK`` runs
unchanged on any of its backends: one document per planned user turn of a run (item,
condition, sample) whose text is the stored probe prompt (exactly what ``userturn render``
shows and the run generated from), one task per model and decoding setting with the template's
stop markers as ``until``, the run's temperature, top-p and token budget. The prompt already is
a chat-formatted text, so lm-eval must not apply a chat template (its default).

``import_samples`` reads lm-eval's ``--log_samples`` files back into a run folder with the same
keys and tables as ``userturn run`` makes: each document carries what the run store needs (its
generation key, plan row, item, context and the assistant answer with its score), so ``label``,
``judge``, ``report``, ``compare`` and ``load_run`` work on the result unchanged
(:mod:`.lmeval_import`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from userturn.errors import ModelError, UserturnError
from userturn.integrations.folders import write_folder
from userturn.records import HUMAN
from userturn.store.database import RunStore
from userturn.store.rows import GenerationRow, PlanRow, Probed, item_record

FORMAT = "userturn-lm-eval/1"
DOCS_LOADER = "userturn_docs.py"
MANIFEST = "userturn_export.json"
# The oldest lm-eval the task folder is tested on (0.4.8 refuses `custom_dataset`).
MIN_LM_EVAL = (0, 4, 13)
LOADER_SOURCE = f'''"""Loads this folder's documents for lm-evaluation-harness (written by `userturn export-task`).

The task YAMLs name this loader (`custom_dataset`), so the folder can be moved or copied to
another machine and still finds its JSONL files beside it."""

from importlib import metadata
from pathlib import Path

import datasets

HERE = Path(__file__).resolve().parent
MINIMUM = {MIN_LM_EVAL!r}


def load(docs, **_):
    try:
        found = metadata.version("lm_eval")
    except metadata.PackageNotFoundError:
        found = None
    if found is not None and tuple(int(p) for p in found.split(".")[:3] if p.isdigit()) < MINIMUM:
        raise RuntimeError(f"userturn's task folder needs lm-eval >= {{'.'.join(map(str, MINIMUM))}} "
                           f"(this is {{found}}): pip install -U lm-eval")
    return datasets.DatasetDict(
        {{"test": datasets.load_dataset("json", data_files=str(HERE / docs), split="train")}})
'''


@dataclass(frozen=True)
class ExportedTask:
    """One lm-eval task of an export: its name, the model its documents were rendered for, its
    decoding settings and how many documents it has."""

    name: str
    tag: str
    model: str
    temperature: float
    top_p: float
    max_tokens: int
    stop: tuple[str, ...]
    docs: int
    location: str | None = None
    """Where lm-eval loads the model from (``pretrained=``); None: userturn cannot say."""


# -- export ---------------------------------------------------------------------------------

def export_task(store: RunStore, out: Path, *, force: bool = False) -> list[ExportedTask]:
    """Write the run's user-turn pass as an lm-eval task folder at ``out``; returns its tasks."""
    meta = store.meta()
    plan = [row for row in store.plan_rows("user") if row.model != HUMAN]
    if not plan:
        raise UserturnError(f"{store.folder} has no planned user turns of a model to export")
    generations = store.generations([row.key for row in plan])
    missing = [row.key for row in plan if row.key not in generations]
    if missing:
        raise UserturnError(f"{store.folder}: {len(missing)} planned user turn(s) have no stored "
                            "prompt (the run stopped before them): resume it with `userturn "
                            "run` first")
    answers = _assistants(store, plan)
    contexts = {row.context: (row.perturbation, row.answer or "")
                for row in store.user_turn_rows()}
    items = {dataset: store.items(dataset) for dataset in sorted({r.dataset for r in plan})}
    export = hashlib.sha256(json.dumps([str(Path(store.folder).resolve()), meta.started,
                                        sorted(r.key for r in plan)]).encode()
                            ).hexdigest()[:16]
    locations = {model: _location(model) for model in sorted({row.model for row in plan})}
    run = {"config": meta.config, "locations": locations,
           "models": {spec: model.model_dump(exclude_none=True)
                      for spec, model in meta.models.items()},
           "versions": meta.versions, "source": str(Path(store.folder).resolve()),
           "export": export}
    groups: dict[tuple[str, float, float, int, tuple[str, ...]], list[dict[str, Any]]] = {}
    bases: dict[str, str] = {}  # a task's model, as the tables print it -> its spec
    for row in plan:
        gen = generations[row.key]
        params = gen.request.params
        # One task per probed model and its variants, named as the tables name it.
        name = Probed(row.model, row.user_variant, row.enable_thinking).name
        bases[name] = row.model
        group = (name, params.temperature, params.top_p, params.max_tokens, gen.request.stop)
        answer = answers.get(row.assistant_key) if row.assistant_key else None
        item = items[row.dataset].get(row.item_id)
        groups.setdefault(group, []).append(_doc(
            row, _generation_record(gen), answer, contexts.get(row.context),
            item_record(item) if item is not None else None, run))
    tasks = [replace(task, location=locations.get(bases[task.model]))
             for task in _name_tasks(groups)]

    def build(folder: Path) -> None:
        (folder / DOCS_LOADER).write_text(LOADER_SOURCE, encoding="utf-8")
        for task, docs in zip(tasks, groups.values()):
            with open(folder / f"{task.name}.jsonl", "w", encoding="utf-8") as handle:
                for doc in docs:
                    handle.write(json.dumps(doc, ensure_ascii=False) + "\n")
            (folder / f"{task.name}.yaml").write_text(task_yaml(task), encoding="utf-8")
        (folder / MANIFEST).write_text(json.dumps(
            {"format": FORMAT, "export": export, "run": run["source"],
             "tasks": [task.__dict__ for task in tasks]}, indent=1, ensure_ascii=False),
            encoding="utf-8")
        (folder / "README.md").write_text(task_readme(tasks, Path(out).resolve()),
                                          encoding="utf-8")

    write_folder(out, build, force=force)
    return tasks


def _location(model: str) -> str | None:
    """Where lm-eval loads ``model`` from (None: a model with no weights to load)."""
    from userturn.backends.models import model_location

    try:
        return model_location(model)
    except ModelError:
        return None


def _assistants(store: RunStore, plan: Sequence[PlanRow]) -> dict[str, dict[str, Any]]:
    """assistant key -> its plan row, generation row and scores, for every answer a user turn
    follows (a reference or data answer has no key)."""
    keys = sorted({row.assistant_key for row in plan if row.assistant_key})
    planned = {row.key: asdict(row) for row in store.plan_rows("assistant")}
    rows = store.generations(keys)
    wanted = set(keys)
    scores: dict[str, list[dict[str, Any]]] = {}
    for score in store.answer_rows():  # one row per answer and scorer (None: not scored)
        if score.key in wanted and score.scorer is not None:
            scores.setdefault(score.key, []).append(
                {"scorer": score.scorer, "correct": int(bool(score.correct)),  # as SQLite holds it
                 "extracted": score.extracted, "reference": score.reference,
                 "details": dict(score.details)})
    return {key: {"plan": planned.get(key), "generation": _generation_record(rows[key]),
                  "scores": scores.get(key, [])}
            for key in keys if key in rows}


def _generation_record(row: GenerationRow) -> dict[str, Any]:
    """A stored generation as a document carries it (the importer reads it back into the
    same row), one flat JSON object."""
    request, gen = row.request, row.generation
    return {"role": row.role, "model": row.model, "revision": row.revision,
            "template_hash": row.template_hash, "prompt": request.prompt,
            "stop": list(request.stop), "temperature": request.params.temperature,
            "top_p": request.params.top_p, "max_tokens": request.params.max_tokens,
            "sample_index": row.sample_index, "seed": request.seed, "text": gen.text,
            "raw_text": gen.raw_text, "finish_reason": gen.finish_reason,
            "prompt_tokens": gen.prompt_tokens, "completion_tokens": gen.completion_tokens,
            "error": gen.error, "thinking": gen.thinking}


def _doc(plan: PlanRow, gen: Mapping[str, Any], assistant: Mapping[str, Any] | None,
         context: tuple[str, str] | None, item: Mapping[str, Any] | None,
         run: Mapping[str, Any]) -> dict[str, Any]:
    """One document: the prompt lm-eval sends, a few readable fields, and (as one JSON string,
    so every document has the same flat schema for ``datasets``) what the importer needs."""
    request = {name: gen[name] for name in ("role", "model", "revision", "template_hash",
                                            "prompt", "temperature", "top_p", "max_tokens",
                                            "sample_index", "seed", "stop")}
    payload = {"format": FORMAT, "key": plan.key, "plan": asdict(plan), "request": request,
               "context": list(context) if context else None, "item": item,
               "assistant": assistant, "run": run}
    return {"prompt": gen["prompt"], "key": plan.key, "model": plan.model,
            "dataset": plan.dataset, "item_id": plan.item_id,
            "perturbation": plan.perturbation, "temperature": plan.temperature,
            "sample_index": plan.sample_index,
            "userturn": json.dumps(payload, ensure_ascii=False)}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "model"


def _name_tasks(groups: Mapping[tuple[str, float, float, int, tuple[str, ...]],
                                Sequence[Any]]) -> list[ExportedTask]:
    """Task names readable and unique: ``userturn_MODEL_tTEMP``, with the top-p and budget
    where one model has several at a temperature."""
    tasks, seen = [], set()
    for (model, temperature, top_p, max_tokens, stop), docs in groups.items():
        tag = f"userturn_{_slug(model)}"
        name = f"{tag}_t{temperature:g}".replace(".", "_")
        if name in seen:
            name = f"{name}_p{top_p:g}_n{max_tokens}".replace(".", "_")
        base, number = name, 2
        while name in seen:
            name, number = f"{base}_{number}", number + 1
        seen.add(name)
        tasks.append(ExportedTask(name, tag, model, temperature, top_p, max_tokens, stop,
                                  len(docs)))
    return tasks


def task_yaml(task: ExportedTask) -> str:
    """The task's YAML: the prompt is the document's ``prompt`` field, sent as is; greedy at
    temperature 0, else sampled with the run's temperature and top-p."""
    generation: dict[str, Any] = {"until": list(task.stop), "max_gen_toks": task.max_tokens}
    if task.temperature > 0:
        generation.update(do_sample=True, temperature=task.temperature, top_p=task.top_p)
    else:
        generation.update(do_sample=False, temperature=0.0)
    config = {
        "task": task.name, "tag": [task.tag],
        "dataset_kwargs": {"docs": f"{task.name}.jsonl"}, "test_split": "test",
        "output_type": "generate_until", "doc_to_text": "prompt", "doc_to_target": "",
        "target_delimiter": "", "num_fewshot": 0, "generation_kwargs": generation,
        # lm-eval's own score here is the share of empty user turns (an exact match with the
        # empty target); the follow-up rate comes from `userturn import` and `userturn report`.
        "metric_list": [{"metric": "exact_match", "aggregation": "mean",
                         "higher_is_better": False}],
        "metadata": {"version": 1, "userturn_model": task.model},
    }
    body = yaml.safe_dump(config, sort_keys=False, allow_unicode=True, width=1000)
    return (f"# The user-turn pass of userturn for {task.model} ({task.docs} documents);\n"
            "# run it without --apply_chat_template: each prompt already is the chat text.\n"
            f"custom_dataset: !function {DOCS_LOADER[:-3]}.load\n{body}")


def run_command(where: str, folder: Path, tasks: str, *, wrap: bool = False) -> str:
    """The lm-eval command that runs ``tasks`` of ``folder`` on the model at ``where``, as the
    README and ``export-task`` print it: float32, the dtype the run's own user turns were
    generated in, so lm-eval writes the same greedy turns."""
    gap = " \\\n    " if wrap else " "  # a shell line continuation in the README
    return (f"lm-eval run --model hf --model_args pretrained={where} dtype=float32{gap}"
            f"--include_path {folder} --tasks {tasks} --log_samples --output_path lmeval-out")


def task_readme(tasks: Sequence[ExportedTask], folder: Path) -> str:
    version = ".".join(map(str, MIN_LM_EVAL))
    lines = ["# userturn: the user-turn pass as lm-evaluation-harness tasks", "",
             "Each document is the probe prompt of one planned user turn (item, condition, "
             "sample), exactly as the run stored it. Run every task of a model with lm-eval "
             f"{version} or later on any backend (no `--apply_chat_template`: the prompt "
             "already is the chat text), then read the samples back with userturn. The "
             "commands name this folder where it was written; a copy elsewhere takes its "
             "own path.", ""]
    for tag in dict.fromkeys(task.tag for task in tasks):
        task = next(task for task in tasks if task.tag == tag)
        where = task.location or f"PATH_OR_HUB_ID_OF_{_slug(task.model)}"
        if task.location is None:
            lines += [f"{task.model} has no weights userturn can point lm-eval at: give "
                      "the model's folder or hub id.", ""]
        lines += ["```bash", run_command(where, folder, tag, wrap=True),
                  f"userturn import --from lm-eval lmeval-out -o runs/{tag}-lmeval",
                  "```", ""]
    lines += ["| task | model | temperature | top-p | max tokens | until | documents |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {t.name} | {t.model} | {t.temperature:g} | {t.top_p:g} | {t.max_tokens} | "
              f"{', '.join(json.dumps(s) for s in t.stop)} | {t.docs} |" for t in tasks]
    return "\n".join(lines) + "\n"
