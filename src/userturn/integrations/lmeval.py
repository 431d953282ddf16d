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
``judge``, ``report``, ``compare`` and ``load_run`` work on the result unchanged.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import yaml

from userturn.errors import StoreError, UserturnError
from userturn.integrations.folders import write_folder
from userturn.records import HUMAN, Generation, GenerationParams, Request, Score
from userturn.store.database import RunStore, generation_key
from userturn.store.lock import RunLock

FORMAT = "userturn-lm-eval/1"
DOCS_LOADER = "userturn_docs.py"
MANIFEST = "userturn_export.json"
LOADER_SOURCE = '''"""Loads this folder's documents for lm-evaluation-harness (written by `userturn export-task`).

The task YAMLs name this loader (`custom_dataset`), so the folder can be moved or copied to
another machine and still finds its JSONL files beside it."""

from pathlib import Path

import datasets

HERE = Path(__file__).resolve().parent


def load(docs, **_):
    return datasets.DatasetDict(
        {"test": datasets.load_dataset("json", data_files=str(HERE / docs), split="train")})
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


@dataclass(frozen=True)
class Imported:
    """What ``import_samples`` stored: user turns, files read, and the export they came from."""

    turns: int
    files: int
    export: str


# -- export ---------------------------------------------------------------------------------

def export_task(store: RunStore, out: Path, *, force: bool = False) -> list[ExportedTask]:
    """Write the run's user-turn pass as an lm-eval task folder at ``out``; returns its tasks."""
    meta = store.meta()
    plan = [row for row in store.plan_rows("user") if row["model"] != HUMAN]
    if not plan:
        raise UserturnError(f"{store.folder} has no planned user turns of a model to export")
    generations = {key: dict(row) for key, row in
                   store.generations([row["key"] for row in plan]).items()}
    missing = [row["key"] for row in plan if row["key"] not in generations]
    if missing:
        raise UserturnError(f"{store.folder}: {len(missing)} planned user turn(s) have no stored "
                            "prompt (the run stopped before them): resume it with `userturn "
                            "run` first")
    answers = _assistants(store, plan)
    contexts = {row["context"]: (row["perturbation"], row["answer"] or "")
                for row in store.user_turn_rows()}
    items = {dataset: store.items(dataset) for dataset in sorted({r["dataset"] for r in plan})}
    export = hashlib.sha256(json.dumps([str(Path(store.folder).resolve()), meta.get("started"),
                                        sorted(r["key"] for r in plan)]).encode()
                            ).hexdigest()[:16]
    run = {"config": meta.get("config", {}), "models": meta.get("models", {}),
           "versions": meta.get("versions", {}), "source": str(Path(store.folder).resolve()),
           "export": export}
    groups: dict[tuple[str, float, float, int, tuple[str, ...]], list[dict[str, Any]]] = {}
    for row in plan:
        gen = generations[row["key"]]
        stop = tuple(json.loads(gen["stop"]))
        group = (row["model"], gen["temperature"], gen["top_p"], gen["max_tokens"], stop)
        groups.setdefault(group, []).append(_doc(row, gen, answers.get(row["assistant_key"]),
                                                 contexts.get(row["context"]),
                                                 items[row["dataset"]].get(row["item_id"]),
                                                 run))
    tasks = _name_tasks(groups)

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
        (folder / "README.md").write_text(task_readme(tasks, folder_name=Path(out).name),
                                          encoding="utf-8")

    write_folder(out, build, force=force)
    return tasks


def _assistants(store: RunStore, plan: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """assistant key -> its plan row, generation row and scores, for every answer a user turn
    follows (a reference or data answer has no key)."""
    keys = sorted({row["assistant_key"] for row in plan if row["assistant_key"]})
    planned = {row["key"]: row for row in store.plan_rows("assistant")}
    rows = store.generations(keys)
    scores: dict[str, list[dict[str, Any]]] = {}
    for score in store.scores_of(keys):
        scores.setdefault(score["key"], []).append(
            {name: score[name] for name in ("scorer", "correct", "extracted", "reference",
                                            "details")})
    return {key: {"plan": planned.get(key), "generation": _generation_row(dict(rows[key])),
                  "scores": scores.get(key, [])}
            for key in keys if key in rows}


GENERATION_FIELDS = ("role", "model", "revision", "template_hash", "prompt", "stop",
                     "temperature", "top_p", "max_tokens", "sample_index", "seed", "text",
                     "raw_text", "finish_reason", "prompt_tokens", "completion_tokens", "error",
                     "thinking")


def _generation_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {name: json.loads(row[name]) if name == "stop" else row[name]
            for name in GENERATION_FIELDS}


def _doc(plan: Mapping[str, Any], gen: Mapping[str, Any], assistant: Mapping[str, Any] | None,
         context: tuple[str, str] | None, item: Mapping[str, Any] | None,
         run: Mapping[str, Any]) -> dict[str, Any]:
    """One document: the prompt lm-eval sends, a few readable fields, and (as one JSON string,
    so every document has the same flat schema for ``datasets``) what the importer needs."""
    request = {name: gen[name] for name in ("role", "model", "revision", "template_hash",
                                            "prompt", "temperature", "top_p", "max_tokens",
                                            "sample_index", "seed")}
    request["stop"] = json.loads(gen["stop"])
    payload = {"format": FORMAT, "key": plan["key"], "plan": dict(plan), "request": request,
               "context": list(context) if context else None, "item": item,
               "assistant": assistant, "run": run}
    return {"prompt": gen["prompt"], "key": plan["key"], "model": plan["model"],
            "dataset": plan["dataset"], "item_id": plan["item_id"],
            "perturbation": plan["perturbation"], "temperature": plan["temperature"],
            "sample_index": plan["sample_index"],
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


def task_readme(tasks: Sequence[ExportedTask], folder_name: str) -> str:
    lines = ["# userturn: the user-turn pass as lm-evaluation-harness tasks", "",
             "Each document is the probe prompt of one planned user turn (item, condition, "
             "sample), exactly as the run stored it. Run every task of a model with lm-eval "
             "on any backend (no `--apply_chat_template`: the prompt already is the chat "
             "text), then read the samples back with userturn:", ""]
    for tag in dict.fromkeys(task.tag for task in tasks):
        model = next(task.model for task in tasks if task.tag == tag)
        lines += ["```bash",
                  f"lm-eval run --model hf --model_args pretrained=PATH_OR_ID_OF_{_slug(model)} "
                  f"\\\n    --include_path {folder_name} --tasks {tag} --log_samples "
                  "--output_path lmeval-out",
                  f"userturn import --from lm-eval lmeval-out -o runs/{tag}-lmeval",
                  "```", ""]
    lines += ["| task | model | temperature | top-p | max tokens | until | documents |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {t.name} | {t.model} | {t.temperature:g} | {t.top_p:g} | {t.max_tokens} | "
              f"{', '.join(json.dumps(s) for s in t.stop)} | {t.docs} |" for t in tasks]
    return "\n".join(lines) + "\n"


# -- import ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Sample:
    where: str  # file:line, for the error lines
    payload: dict[str, Any]
    response: str


def import_samples(paths: Sequence[Path], out: Path, *, labeller: str | None = None) -> Imported:
    """Read lm-eval ``--log_samples`` files (or folders holding ``samples_*.jsonl``) of tasks
    that ``export_task`` wrote into a new run folder ``out``, and label the user turns offline
    (the run's own labeller unless ``labeller`` is given). Every bad or mismatched file is
    refused in one line, before anything is written."""
    files = sample_files(paths)
    samples = [sample for path in files for sample in _read(path)]
    if not samples:
        raise UserturnError(f"{', '.join(map(str, paths))}: no lm-eval samples in it")
    exports = {s.payload["run"]["export"] for s in samples}
    if len(exports) > 1:
        raise UserturnError("the samples come from different userturn exports "
                            f"({', '.join(sorted(exports))}): import each into its own run")
    seen: dict[str, str] = {}
    for sample in samples:
        if sample.payload["key"] in seen:
            raise UserturnError(f"{sample.where}: the same document as {seen[sample.payload['key']]}"
                                " (a task's samples given twice?)")
        seen[sample.payload["key"]] = sample.where
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise StoreError(f"{out} exists and is not empty: import into a new run folder")
    run = samples[0].payload["run"]
    with RunLock(out, "import"):
        store = RunStore.create(out)
        try:
            _store_samples(store, samples, run, files)
            from userturn.probe.pipeline import label_turns

            config = run.get("config") or {}
            label_turns(store, labeller or config.get("labeller", "cascade"))
            store.set_meta({"finished": time.time()})
        finally:
            store.close()
    return Imported(len(samples), len(files), exports.pop())


def sample_files(paths: Sequence[Path]) -> list[Path]:
    """The files named, and every ``samples_*.jsonl`` under the folders named."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(path.rglob("samples_*.jsonl"))
            if not found:
                raise UserturnError(f"{path}: no lm-eval samples_*.jsonl files in it (run "
                                    "lm-eval with --log_samples --output_path)")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise UserturnError(f"{path}: no such file or folder")
    return files


def _read(path: Path) -> Iterable[_Sample]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserturnError(f"{path}: cannot read ({exc})") from None
    for number, line in enumerate(lines, 1):
        if line.strip():
            yield _sample(f"{path}:{number}", line)


def _sample(where: str, line: str) -> _Sample:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UserturnError(f"{where}: not JSON ({exc.msg}): not an lm-eval samples file"
                            ) from None
    if not isinstance(record, dict) or not isinstance(record.get("doc"), dict) \
            or "resps" not in record or "arguments" not in record:
        raise UserturnError(f"{where}: not an lm-eval --log_samples record (no doc, resps "
                            "and arguments)")
    doc = record["doc"]
    if "userturn" not in doc:
        raise UserturnError(f"{where}: not a document of a userturn task (export one with "
                            "`userturn export-task RUN --harness lm-eval -o DIR`)")
    try:
        payload = json.loads(doc["userturn"])
    except (TypeError, json.JSONDecodeError):
        raise UserturnError(f"{where}: the document's userturn field is damaged") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else None
        raise UserturnError(f"{where}: a userturn task of format {found!r}; this userturn "
                            f"reads {FORMAT!r}")
    _check(where, record, payload)
    return _Sample(where, payload, _response(where, record))


def _check(where: str, record: Mapping[str, Any], payload: Mapping[str, Any]) -> None:
    """The sample is of the document as exported, sent as exported, with the exported
    settings: anything else would store a turn under a key it was not generated for."""
    request = payload["request"]
    if record["doc"].get("key") != payload["key"] or _key(payload) != payload["key"]:
        raise UserturnError(f"{where}: the document was changed after export (its key does not "
                            "match its prompt and settings)")
    arguments = record["arguments"]
    first = arguments.get("gen_args_0") if isinstance(arguments, dict) else None
    if not isinstance(first, dict) or "arg_0" not in first:
        raise UserturnError(f"{where}: not a generate_until sample (no prompt in arguments)")
    if first["arg_0"] != request["prompt"]:
        raise UserturnError(f"{where}: lm-eval sent another prompt than the exported one (a "
                            "chat template, a system instruction or few-shot examples added? "
                            "run the task without --apply_chat_template, "
                            "--system_instruction and --num_fewshot)")
    settings = first.get("arg_1") or {}
    expected = {"until": request["stop"], "max_gen_toks": request["max_tokens"],
                "temperature": request["temperature"]}
    for name, value in expected.items():
        got = settings.get(name)
        if name == "until" and isinstance(got, list):
            # lm-eval adds the tokenizer's end-of-sequence text to the stop strings.
            got = [marker for marker in got if marker in value] if set(value) <= set(got) \
                else got
        if got is not None and got != value:
            raise UserturnError(f"{where}: generated with {name}={got!r}, exported with "
                                f"{value!r} (--gen_kwargs or an edited task YAML): the turn "
                                "would not be the run's")


def _response(where: str, record: Mapping[str, Any]) -> str:
    resps = record["resps"]
    if not (isinstance(resps, list) and resps and isinstance(resps[0], list) and resps[0]
            and isinstance(resps[0][0], str)):
        raise UserturnError(f"{where}: no generated text in resps")
    if len(resps[0]) > 1:
        raise UserturnError(f"{where}: {len(resps[0])} generations for one document (repeats): "
                            "each sample is its own document, run the task with repeats 1")
    return resps[0][0]


def _key(payload: Mapping[str, Any]) -> str:
    request = payload["request"]
    thinking = ((payload["run"].get("config") or {}).get("thinking")) or "drop"
    return generation_key(request["role"], request["model"], request["revision"],
                          request["template_hash"], _request(request), request["sample_index"],
                          thinking)


def _request(row: Mapping[str, Any]) -> Request:
    return Request(row["prompt"], GenerationParams(row["temperature"], row["top_p"],
                                                   row["max_tokens"]),
                   tuple(row["stop"]), row["seed"])


def _store_samples(store: RunStore, samples: Sequence[_Sample], run: Mapping[str, Any],
                   files: Sequence[Path]) -> None:
    config = dict(run.get("config") or {})
    config["output"] = str(store.folder)
    store.set_meta({"config": config, "models": run.get("models", {}),
                    "versions": run.get("versions", {}), "started": time.time(),
                    "finished": None, "imported_from": {
                        "harness": "lm-eval", "export": run["export"], "run": run.get("source"),
                        "files": [str(path) for path in files]}})
    items: dict[str, dict[str, dict[str, Any]]] = {}
    contexts: dict[str, tuple[str, str, str]] = {}
    assistants: dict[str, Mapping[str, Any]] = {}
    for sample in samples:
        payload = sample.payload
        plan = payload["plan"]
        if payload.get("item"):
            items.setdefault(plan["dataset"], {})[plan["item_id"]] = payload["item"]
        if payload.get("context"):
            perturbation, answer = payload["context"]
            contexts[plan["context"]] = (plan["context"], perturbation, answer)
        if payload.get("assistant") and plan.get("assistant_key"):
            assistants[plan["assistant_key"]] = payload["assistant"]
    for dataset, found in items.items():
        store.put_items(dataset, found.values())
    store.put_contexts(list(contexts.values()))
    _store_assistants(store, assistants)
    store.put_generations([_user_generation(sample) for sample in samples])
    _store_plan(store, "user", [sample.payload["plan"] for sample in samples])


def _user_generation(sample: _Sample) -> tuple[str, str, str, str, str, Request, int, Generation]:
    """The harness's text as a stored generation: ``text`` stripped as userturn's backends do
    (lm-eval already cut it at the stop marker and dropped special tokens); lm-eval's log does
    not say whether a turn ended at its marker or at the budget, so it is stored as stopped."""
    request = sample.payload["request"]
    generation = Generation(sample.response.strip(), sample.response, "stop")
    return (sample.payload["key"], "user", request["model"], request["revision"],
            request["template_hash"], _request(request), request["sample_index"], generation)


def _store_assistants(store: RunStore, assistants: Mapping[str, Mapping[str, Any]]) -> None:
    rows, plan = [], []
    scores: list[tuple[str, str, Score]] = []
    for key, found in assistants.items():
        gen = found["generation"]
        rows.append((key, gen["role"], gen["model"], gen["revision"], gen["template_hash"],
                     _request(gen), gen["sample_index"],
                     Generation(gen["text"], gen["raw_text"], gen["finish_reason"],
                                gen["prompt_tokens"], gen["completion_tokens"], gen["error"],
                                gen["thinking"])))
        scores.extend((key, score["scorer"], Score(bool(score["correct"]), score["extracted"],
                                                   score["reference"], score["details"]))
                      for score in found["scores"])
        if found.get("plan"):
            plan.append(found["plan"])
    store.put_generations(rows)
    store.put_scores(scores)
    _store_plan(store, "assistant", plan)


def _store_plan(store: RunStore, role: str, rows: Sequence[Mapping[str, Any]]) -> None:
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["model"], row["dataset"]), []).append(row)
    for (model, dataset), found in groups.items():
        store.replace_plan(found, role=role, model=model, dataset=dataset)
