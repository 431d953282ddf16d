"""lm-evaluation-harness's ``--log_samples`` output back into a run folder: the samples of a task
folder that :func:`~userturn.integrations.lmeval.export_task` wrote become a run with the same
keys and tables as ``userturn run`` makes, labelled offline (docs/integrations.md)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from pydantic import ValidationError

from userturn.config import Experiment
from userturn.errors import StoreError, UserturnError
from userturn.integrations.lmeval import FORMAT
from userturn.labels.plan import LabellingPlan
from userturn.labels.sources import labeller_named
from userturn.labels.stages import label_turns
from userturn.records import Generation, GenerationParams, Item, Labeller, Request, Score
from userturn.settings import DocumentError, bad_text, parse_json, utf8_reason
from userturn.store.database import RunStore
from userturn.store.lock import RunLock
from userturn.store.meta import RunMeta
from userturn.store.rows import (
    ContextRow,
    GenerationRow,
    PlanRow,
    Probed,
    ScoreRow,
    item_from_record,
    typed_model,
)
from userturn.store.sqlite import generation_key


@dataclass(frozen=True)
class Imported:
    """What ``import_samples`` stored: user turns, files read, and the export they came from."""

    turns: int
    files: int
    export: str


@dataclass(frozen=True)
class _Answer:
    """The assistant answer a user turn follows, as the exported run stored it."""

    plan: PlanRow | None
    generation: GenerationRow
    scores: tuple[ScoreRow, ...]


@dataclass(frozen=True)
class _Sample:
    """One lm-eval sample, checked and read into the rows the store takes."""

    where: str  # file:line, for the error lines
    run: Mapping[str, Any]
    plan: PlanRow
    user: GenerationRow
    context: ContextRow | None
    item: Item | None
    answer: _Answer | None


def import_samples(paths: Sequence[Path], out: Path, *, labeller: Labeller | None = None,
                   allow_model_mismatch: bool = False) -> Imported:
    """Read lm-eval ``--log_samples`` files (or folders holding ``samples_*.jsonl``) of tasks
    that ``export_task`` wrote into a new run folder ``out``, and label the user turns offline
    (the run's own labeller unless ``labeller`` is given). Every bad or mismatched file is
    refused in one line, before anything is written; so are samples of a model that cannot be
    the run's (lm-eval's ``--model`` and ``--model_args``, from the results file beside them),
    unless ``allow_model_mismatch``."""
    files = sample_files(paths)
    samples = [sample for path in files for sample in _read(path)]
    if not samples:
        raise UserturnError(f"{', '.join(map(str, paths))}: no lm-eval samples in it")
    ran = {path: ran_model(path) for path in files}
    for sample in samples:
        _check_model(sample, ran[Path(sample.where.rsplit(":", 1)[0])], allow_model_mismatch)
    exports = {s.run["export"] for s in samples}
    if len(exports) > 1:
        raise UserturnError("the samples come from different userturn exports "
                            f"({', '.join(sorted(exports))}): import each into its own run")
    seen: dict[str, str] = {}
    for sample in samples:
        if sample.plan.key in seen:
            raise UserturnError(f"{sample.where}: the same document as {seen[sample.plan.key]}"
                                " (a task's samples given twice?)")
        seen[sample.plan.key] = sample.where
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise StoreError(f"{out} exists and is not empty: import into a new run folder")
    run = samples[0].run
    meta = _run_meta(samples[0].where, run, out, files, list(ran.values()),
                     allow_model_mismatch)
    chosen = labeller_named(labeller or meta.stored(LabellingPlan).labeller).name
    with RunLock(out, "import"):
        store = RunStore.create(out)
        try:
            store.put_meta(meta)
            _store_samples(store, samples)
            label_turns(store, chosen)
            store.update_meta(finished=time.time())
        finally:
            store.close()
    return Imported(len(samples), len(files), exports.pop())


def _run_meta(where: str, run: Mapping[str, Any], out: Path, files: Sequence[Path],
              ran: Sequence[RanModel], mismatch_allowed: bool) -> RunMeta:
    """The new run's metadata: the exported run's settings, models and versions (its output
    the new folder), and where the turns came from: the files, and the model lm-eval ran."""
    config = dict(run.get("config") or {})
    config["output"] = str(out)
    try:  # as `label`, `report` and a rerun will read them back: damage is refused now
        Experiment.stored(config)
    except UserturnError as exc:
        raise UserturnError(f"{where}: the exported run's settings are damaged: {exc}") from None
    try:
        return RunMeta.model_validate({
            "config": config, "models": run.get("models") or {},
            "versions": run.get("versions") or {}, "started": time.time(), "finished": None,
            "imported_from": {"harness": "lm-eval", "export": run["export"],
                              "run": run.get("source"), "files": [str(path) for path in files],
                              "lm_eval": [asdict(model) for model in dict.fromkeys(ran)],
                              "model_mismatch_allowed": mismatch_allowed}})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UserturnError(f"{where}: the exported run's metadata is damaged "
                            f"({'.'.join(map(str, first['loc']))}: {first['msg']})") from None


@dataclass(frozen=True)
class RanModel:
    """The model lm-eval ran, as its results file says (None: no results file was found)."""

    results: str | None
    model: str | None = None
    model_args: str | None = None
    lm_eval_version: str | None = None

    @property
    def loaded(self) -> str | None:
        """What it loaded: ``pretrained=`` (hf, vllm) or ``model=`` (API backends)."""
        args = dict(part.split("=", 1) for part in (self.model_args or "").split(",")
                    if "=" in part)
        return args.get("pretrained") or args.get("model")


def ran_model(samples: Path) -> RanModel:
    """The model and model_args of lm-eval's run that wrote ``samples``: its ``results_*.json``
    beside it (the one of the same time, else the only one)."""
    stamp = samples.stem.rsplit("_", 1)[-1]
    found = sorted(samples.parent.glob(f"results_{stamp}.json")) or sorted(
        samples.parent.glob("results_*.json"))
    if len(found) != 1:
        return RanModel(None)
    try:
        results = parse_json(found[0].read_text(encoding="utf-8"))
        harness_run = results.get("config") or {}
        args = harness_run.get("model_args")
        if isinstance(args, dict):
            args = ",".join(f"{key}={value}" for key, value in args.items())
        ran = RanModel(str(found[0]), harness_run.get("model"), args or "",
                       results.get("lm_eval_version"))
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as exc:
        raise UserturnError(f"{found[0]}: not an lm-eval results file ({exc})") from None
    for name in ("model", "model_args", "lm_eval_version"):
        problem = _text_problem(getattr(ran, name))
        if problem is not None:  # stored with the run, and model_args read as a path
            raise UserturnError(f"{found[0]}: not an lm-eval results file ({name} {problem})")
    return ran


def _unstorable_number(value: Any, path: str) -> str | None:
    """Where the exported payload holds a number the export never writes and the store cannot
    hold: NaN or infinity (JSON's extension), or an integer past SQLite's 64 bits."""
    if isinstance(value, float) and not math.isfinite(value) or \
            isinstance(value, int) and not -2**63 <= value < 2**63:
        return f"{path} is {str(value)[:40]}"
    items = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list) else ()
    for key, item in items:
        found = _unstorable_number(item, f"{path}.{key}" if isinstance(value, dict)
                                   else f"{path}[{key}]")
        if found is not None:
            return found
    return None


def _text_problem(value: object) -> str | None:
    """Why a value read as text is not usable text (None: it is, or it is absent)."""
    if value is None:
        return None
    if not isinstance(value, str):
        return f"is a {type(value).__name__}, not text"
    if any(ord(c) < 32 and c not in "\t\n\r" for c in value):
        return "holds a control character, such as NUL"
    return utf8_reason(value) if bad_text(value) is not None else None


def _check_model(sample: _Sample, ran: RanModel, allowed: bool) -> None:
    """The samples are of the run's model: lm-eval loaded the model's spec, its name or the
    location the export wrote (``pretrained=``). Anything else would store another model's
    turns under the run's model and revision."""
    if allowed:
        return
    spec = sample.plan.model
    if ran.results is None:
        raise UserturnError(f"{sample.where}: no lm-eval results_*.json beside it, so which "
                            "model wrote these turns is unknown: give lm-eval's --output_path "
                            "folder, or --allow-model-mismatch to store them as "
                            f"{spec}'s anyway")
    location = (sample.run.get("locations") or {}).get(spec)
    accepted = {spec, spec.split("/", 1)[1] if spec.startswith(
        ("transformers/", "vllm/", "llamacpp/")) else spec, location}
    loaded = ran.loaded
    same = loaded is not None and (loaded.rstrip("/") in accepted or (
        location is not None and Path(loaded).expanduser().resolve() == Path(location)))
    if not same:
        raise UserturnError(f"{sample.where}: lm-eval ran --model {ran.model} --model_args "
                            f"{ran.model_args or '(none)'}, not the run's model {spec}"
                            + (f" ({location})" if location else "")
                            + ": give --allow-model-mismatch to store its turns as "
                            f"{spec}'s anyway")


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
        record = parse_json(line)
    except json.JSONDecodeError as exc:
        raise UserturnError(f"{where}: not JSON ({exc.msg}): not an lm-eval samples file"
                            ) from None
    except DocumentError as exc:
        raise UserturnError(f"{where}: not JSON ({exc}): not an lm-eval samples file") from None
    if not isinstance(record, dict) or not isinstance(record.get("doc"), dict) \
            or "resps" not in record or "arguments" not in record:
        raise UserturnError(f"{where}: not an lm-eval --log_samples record (no doc, resps "
                            "and arguments)")
    doc = record["doc"]
    if "userturn" not in doc:
        raise UserturnError(f"{where}: not a document of a userturn task (export one with "
                            "`userturn export-task RUN --harness lm-eval -o DIR`)")
    try:
        payload = parse_json(doc["userturn"])
    except DocumentError as exc:
        raise UserturnError(f"{where}: the document's userturn field is damaged ({exc})"
                            ) from None
    except (TypeError, ValueError):
        raise UserturnError(f"{where}: the document's userturn field is damaged") from None
    found = bad_text({"resps": record["resps"], "arguments": record["arguments"],
                      "doc.userturn": payload})
    if found is not None:  # SQLite, the report and every export refuse such text
        raise UserturnError(f"{where}: {found[0]}: {utf8_reason(found[1])}")
    number = _unstorable_number(payload, "doc.userturn")
    if number is not None:
        raise UserturnError(f"{where}: {number}: the document's userturn field is damaged")
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else None
        raise UserturnError(f"{where}: a userturn task of format {found!r}; this userturn "
                            f"reads {FORMAT!r}")
    try:
        _check(where, record, payload)
        return _typed(where, payload, _response(where, record))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UserturnError(f"{where}: the document's userturn field is damaged "
                            f"({type(exc).__name__}: {exc})") from None


def _typed(where: str, payload: Mapping[str, Any], response: str) -> _Sample:
    """The sample as the rows the store takes (a malformed field raises here, before any
    write): lm-eval's text as the user turn, stripped as userturn's backends strip it (lm-eval
    already cut it at the stop marker and dropped special tokens). lm-eval's log does not say
    whether a turn ended at its marker or at the budget, so it is stored as stopped."""
    plan = _plan_row(payload["plan"])
    if plan.key != payload["key"] or plan.role != "user":
        raise ValueError("its plan row is not of its user turn")
    request = payload["request"]
    user = GenerationRow(plan.key, "user", plan.model, request["revision"],
                         request["template_hash"], _request(request), request["sample_index"],
                         Generation(response.strip(), response, "stop"))
    context = None
    if payload.get("context"):
        perturbation, answer = payload["context"]
        context = ContextRow(plan.context, perturbation, answer)
    found_item = payload.get("item") or None
    if found_item is not None and (not isinstance(found_item, dict)
                                   or found_item.get("id") != plan.item_id):
        raise ValueError(f"its item is not item {plan.item_id!r}")
    item = item_from_record(found_item) if found_item is not None else None
    found = payload.get("assistant")
    answer_row = _answer(plan.assistant_key, found) if found and plan.assistant_key else None
    return _Sample(where, payload["run"], plan, user, context, item, answer_row)


def _answer(key: str, found: Mapping[str, Any]) -> _Answer:
    gen = found["generation"]
    row = GenerationRow(key, gen["role"], gen["model"], gen["revision"], gen["template_hash"],
                        _request(gen), gen["sample_index"],
                        Generation(gen["text"], gen["raw_text"], gen["finish_reason"],
                                   gen["prompt_tokens"], gen["completion_tokens"], gen["error"],
                                   gen["thinking"]))
    scores = tuple(ScoreRow(key, score["scorer"], Score(bool(score["correct"]),
                                                        score["extracted"], score["reference"],
                                                        score["details"]))
                   for score in found["scores"])
    return _Answer(_plan_row(found["plan"]) if found.get("plan") else None, row, scores)


def _plan_row(record: Mapping[str, Any]) -> PlanRow:
    """An exported plan row; one exported before the typed variants has them in its model's
    name, read as the store reads its own such rows."""
    model, user_variant, enable_thinking = typed_model(
        record["model"], record.get("user_variant"), record.get("enable_thinking"))
    return PlanRow(**{**record, "model": model, "user_variant": user_variant,
                      "enable_thinking": enable_thinking})


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
    # The variants are typed in the plan row; an export from before them has them in the
    # request's model name.
    plan = payload["plan"]
    model, user_variant, enable_thinking = typed_model(
        request["model"], plan.get("user_variant"), plan.get("enable_thinking"))
    return generation_key(request["role"], model, request["revision"],
                          request["template_hash"], _request(request), request["sample_index"],
                          thinking, user_variant=user_variant, enable_thinking=enable_thinking)


def _request(row: Mapping[str, Any]) -> Request:
    return Request(row["prompt"], GenerationParams(row["temperature"], row["top_p"],
                                                   row["max_tokens"]),
                   tuple(row["stop"]), row["seed"])


def _store_samples(store: RunStore, samples: Sequence[_Sample]) -> None:
    items: dict[str, dict[str, Item]] = {}
    contexts: dict[str, ContextRow] = {}
    answers: dict[str, _Answer] = {}
    for sample in samples:
        if sample.item is not None:
            items.setdefault(sample.plan.dataset, {})[sample.plan.item_id] = sample.item
        if sample.context is not None:
            contexts[sample.context.context] = sample.context
        if sample.answer is not None:
            answers[sample.answer.generation.key] = sample.answer
    for dataset, found in items.items():
        store.put_items(dataset, found.values())
    store.put_contexts(list(contexts.values()))
    store.put_generations([answer.generation for answer in answers.values()])
    store.put_scores([score for answer in answers.values() for score in answer.scores])
    _store_plan(store, "assistant", [a.plan for a in answers.values() if a.plan is not None])
    store.put_generations([sample.user for sample in samples])
    _store_plan(store, "user", [sample.plan for sample in samples])


def _store_plan(store: RunStore, role: str, rows: Sequence[PlanRow]) -> None:
    groups: dict[tuple[str, str, str, str], list[PlanRow]] = {}
    for row in rows:
        groups.setdefault((row.model, row.dataset, row.user_variant, row.enable_thinking),
                          []).append(row)
    for (model, dataset, user_variant, enable_thinking), found in groups.items():
        store.replace_plan(found, role=role, probed=Probed(model, user_variant, enable_thinking),
                           dataset=dataset)
