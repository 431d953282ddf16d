"""``userturn train sft`` and ``userturn train rl``: one straight line each.

    split the dataset (held-out evaluation items first) -> training data -> TRL trainer with a
    LoRA adapter (or full fine-tuning) -> adapter + merged checkpoint + manifest
    -> the probe on base and checkpoint over the held-out items -> paired comparison

The merged checkpoint is a plain model folder, so every backend (transformers, vLLM, a server)
can probe it. TRL, peft and datasets are imported here only.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from userturn.backends.hf import TransformersBackend
from userturn.backends.models import resolve_model
from userturn.backends.turns import as_list
from userturn.chat.render import (
    ChatTemplate,
    derive_markers,
    render_assistant_turn,
    render_user_turn,
)
from userturn.errors import ModelError, UserturnError
from userturn.probe.pipeline import Progress, run_experiment, versions
from userturn.store.atomic import make_folder
from userturn.store.turns import read_answers
from userturn.train.data import (
    Split,
    conversations_file,
    self_generated,
    split_dataset,
    write_conversations,
)
from userturn.train.evaluate import BeforeAfter, before_after, summary_rows
from userturn.train.masks import build_example
from userturn.train.settings import RLSettings, SFTSettings, Training, TrainSettings

MANIFEST = "manifest.json"


@dataclass
class Outcome:
    output: Path
    manifest: dict[str, Any]
    before_after: BeforeAfter | None


class TrainingError(UserturnError):
    """A training run that cannot start or produced nothing usable."""


def run_sft(settings: SFTSettings, progress: Progress | None = None,
            log: Callable[[str], None] = print) -> Outcome:
    training, method = settings.training, settings.method
    out = _prepare(settings, "sft")
    split = split_dataset(training.dataset, eval_items=training.eval_items,
                          train_items=training.train_items, seed=training.seed)
    data: dict[str, Any] = {"source": method.data}
    ref = resolve_model(training.model)
    if method.data == "self":
        backend = TransformersBackend(ref, batch_size=settings.evaluation.generation_batch_size,
                                      device=training.device)
        log(f"self-generated data: {len(split.train.items)} training items, "
            f"{method.data_samples} user turns each at T={method.data_temperature:g}")
        selfgen = settings.experiment(backend.spec, split.train.name, out / "selfgen",
                                      limit=None, temperatures=[method.data_temperature],
                                      samples=method.data_samples)
        conversations, stats = self_generated(
            backend, split.train, selfgen, next_answer=method.next_answer,
            mix_correct=method.mix_correct, progress=progress)
        data["self_generated"] = stats.as_dict()
        del backend
    else:
        conversations = conversations_file(method.data, limit=training.train_items)
    if not conversations:
        raise TrainingError("no training conversation: the model wrote no user turn the rules "
                            "label follow_up and none of its answers was correct (try more "
                            "--train-items or --data-samples, or a conversation file)")
    make_folder(out)
    data["sha256"] = write_conversations(out / "data.jsonl", conversations)
    data["conversations"] = len(conversations)
    tokenizer, model = _load(ref.path, training)
    template = ChatTemplate.from_tokenizer(tokenizer, training.model)
    examples = [_example(tokenizer, template, c, settings, number)
                for number, c in enumerate(conversations, 1)]
    kept = [e for e in examples if e is not None]
    data.update(examples=len(kept), without_trained_tokens=len(examples) - len(kept),
                trained_tokens=sum(e.trained_tokens for e in kept), loss_on=method.loss_on)
    if not kept:
        raise TrainingError(f"no conversation has a token to train under --loss-on "
                            f"{method.loss_on} within --max-length {training.max_length}")
    log(f"training on {len(kept)} conversations ({data['trained_tokens']} trained tokens, "
        f"loss on {method.loss_on} turns)")
    from datasets import Dataset as HFDataset
    from trl import SFTConfig, SFTTrainer

    rows = HFDataset.from_list([{"input_ids": e.input_ids, "labels": e.labels} for e in kept])
    args = SFTConfig(**_common_args(training, out, default_lr=1e-5 if training.full else 2e-4),
                     dataset_kwargs={"skip_prepare_dataset": True}, max_length=None)
    trainer = SFTTrainer(model=model, args=args, train_dataset=rows, processing_class=tokenizer,
                         peft_config=_lora(training))
    started = time.time()
    trainer.train()
    record = _training_record(trainer, time.time() - started)
    checkpoint = _save(trainer, tokenizer, out, training)
    del trainer, model
    _free_memory()
    manifest = _manifest(settings, "sft", ref, split, data, record)
    if method.data != "self":  # the split's training items were not used: the file was
        manifest["items"]["train"] = []
    return _finish(settings, out, manifest, split, checkpoint, progress, log,
                   how="self-generated data kept by rejection sampling on its labels"
                   if method.data == "self" else None)


def run_rl(settings: RLSettings, progress: Progress | None = None,
           log: Callable[[str], None] = print) -> Outcome:
    training, method = settings.training, settings.method
    out = _prepare(settings, "rl")
    split = split_dataset(training.dataset, eval_items=training.eval_items,
                          train_items=training.train_items, seed=training.seed)
    ref = resolve_model(training.model)
    backend = TransformersBackend(ref, batch_size=settings.evaluation.generation_batch_size,
                                  device=training.device)
    items = {item.id: item for item in split.train.items}
    make_folder(out)
    if method.reward == "probe":
        # The user turn follows the model's own greedy answer: answer the training items first
        # (a probe run, resumable), then open the user turn after each answer.
        exp = settings.experiment(backend.spec, split.train.name, out / "answers", limit=None,
                                  temperatures=[0.0], samples=1)
        store = run_experiment(exp, backends={backend.spec: backend}, progress=progress,
                               datasets=[split.train])
        answers = {a.item_id: a.text for a in read_answers(store) if a.error is None}
        store.close()
        prompts = [{"prompt": render_user_turn(backend.template, [
            *item.messages, {"role": "assistant", "content": answers[item.id]}]).text,
            "query": item.query, "answer": answers[item.id], "item_id": item.id}
            for item in split.train.items if answers.get(item.id)]
        stops = derive_markers(backend.template).user_stop
    else:
        prompts = [{"prompt": render_assistant_turn(backend.template, list(item.messages)).text,
                    "query": item.query, "answer": "", "item_id": item.id}
                   for item in split.train.items]
        stops = derive_markers(backend.template).assistant_stop
    tokenizer, model = _load(ref.path, training)
    reward = _reward(settings, tokenizer, backend, items, split, stops)
    if method.reward == "probe":
        del backend  # the collab reward keeps the frozen base model to simulate the user
    for row in prompts:
        row["prompt"] = _trl_prompt(tokenizer, row["prompt"])
    original_eos = stop_on_turn_end(model, tokenizer, stops, log)
    completion = method.max_completion_length or (
        settings.probe.user_max_tokens if method.reward == "probe" else settings.probe.max_tokens)
    log(f"{method.algorithm.upper()} with the {method.reward} reward on {len(prompts)} "
        f"prompts, {method.num_generations} completions each (a device batch is one prompt's "
        f"group: --batch-size is not used; --gradient-accumulation groups prompts), "
        f"KL beta {method.beta:g}")
    from datasets import Dataset as HFDataset

    rows = HFDataset.from_list(prompts)
    common = _common_args(training, out, default_lr=1e-5)
    common["per_device_train_batch_size"] = method.num_generations
    rl_args = dict(num_generations=method.num_generations, max_completion_length=completion,
                   beta=method.beta, temperature=method.rl_temperature)
    if method.algorithm == "grpo":
        from trl import GRPOConfig as Config
        from trl import GRPOTrainer as Trainer
    else:
        from trl import RLOOConfig as Config
        from trl import RLOOTrainer as Trainer
    trainer = Trainer(model=model, reward_funcs=[reward], args=Config(**common, **rl_args),
                      train_dataset=rows, processing_class=tokenizer,
                      peft_config=_lora(training))
    started = time.time()
    trainer.train()
    record = _training_record(trainer, time.time() - started)
    restore_stop(trainer.model, original_eos)
    checkpoint = _save(trainer, tokenizer, out, training)
    del trainer, model, reward
    _free_memory()
    data = {"prompts": len(prompts), "reward": method.reward, "completion_tokens": completion}
    manifest = _manifest(settings, "rl", ref, split, data, record)
    return _finish(settings, out, manifest, split, checkpoint, progress, log,
                   how=f"the {method.reward} reward")


def _example(tokenizer: Any, template: ChatTemplate, conversation: Any, settings: SFTSettings,
             number: int) -> Any:
    try:
        return build_example(tokenizer, template, conversation, settings.method.loss_on,
                             settings.training.max_length)
    except ValueError as exc:
        raise TrainingError(f"training conversation {number} (data.jsonl line {number}): "
                            f"{exc}") from None


# --- shared steps --------------------------------------------------------------------------------

def _prepare(settings: TrainSettings, kind: str) -> Path:
    """The output folder, checked and not yet made (the first write makes it, so a refusal of
    the data leaves no empty folder). A finished run there is never overwritten."""
    out = settings.training.output
    if out.exists() and not out.is_dir():
        raise TrainingError(f"--output {out} is a file, not a folder: choose another path")
    manifest = out / MANIFEST
    if manifest.exists():
        old = json.loads(manifest.read_text(encoding="utf-8"))
        if old.get("settings") != settings.model_dump(mode="json") or old.get("kind") != kind:
            raise TrainingError(f"{out} holds another training run ({old.get('kind')}, other "
                                "settings); choose another --output")
        raise TrainingError(f"{out} already holds this finished training run; run "
                            f"`userturn train eval {out}` to repeat the before/after")
    return out


def _load(path: str, training: Training) -> tuple[Any, Any]:
    import warnings

    import torch

    # transformers' renaming notices (gradient -> activation checkpointing) come from TRL's own
    # calls, not from anything the user can change.
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except OSError as exc:
        raise ModelError(f"cannot load {training.model!r}: {str(exc).splitlines()[0]}") from exc
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, model


def _lora(training: Training) -> Any:
    if training.full:
        return None
    from peft import LoraConfig

    return LoraConfig(r=training.lora_r, lora_alpha=training.lora_alpha, lora_dropout=0.0,
                      target_modules="all-linear", task_type="CAUSAL_LM")


def _common_args(training: Training, out: Path, *, default_lr: float) -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available() and training.device != "cpu"
    return dict(output_dir=str(out / "trainer"), learning_rate=training.learning_rate or default_lr,
                max_steps=training.max_steps, num_train_epochs=training.epochs,
                per_device_train_batch_size=training.batch_size,
                gradient_accumulation_steps=training.gradient_accumulation, logging_steps=1,
                save_strategy="no", report_to="none", seed=training.seed,
                use_cpu=not cuda, bf16=cuda and torch.cuda.is_bf16_supported(),
                gradient_checkpointing=cuda if training.gradient_checkpointing is None
                else training.gradient_checkpointing, disable_tqdm=False)


def _trl_prompt(tokenizer: Any, text: str) -> str:
    """TRL tokenizes text prompts with the tokenizer's special tokens on: a BOS the template
    already wrote would then appear twice."""
    bos = tokenizer.bos_token
    adds_bos = tokenizer("")["input_ids"][:1] == [tokenizer.bos_token_id]
    return text[len(bos):] if bos and adds_bos and text.startswith(bos) else text


def stop_on_turn_end(model: Any, tokenizer: Any, stops: Any, log: Callable[[str], None]) -> Any:
    """Generation during RL stops where the probe stops: on the turn's end-of-turn tokens.
    Returns the model's own setting, for :func:`restore_stop`."""
    original = model.generation_config.eos_token_id
    ids = set(as_list(original))
    single = [tokenizer(m, add_special_tokens=False)["input_ids"] for m in stops]
    ids.update(tokens[0] for tokens in single if len(tokens) == 1)
    if stops and not any(len(tokens) == 1 for tokens in single):
        # TRL stops on token ids only: the turn then ends at the completion budget.
        log(f"note: no stop marker of this template ({', '.join(map(repr, stops))}) is one "
            "token; RL completions run to --max-completion-length")
    model.generation_config.eos_token_id = sorted(ids)
    return original


def restore_stop(model: Any, original: Any) -> None:
    """The saved checkpoint keeps the base model's own end-of-sequence setting."""
    seen = set()
    while model is not None and id(model) not in seen:
        seen.add(id(model))
        if hasattr(model, "generation_config"):
            model.generation_config.eos_token_id = original
        model = getattr(model, "base_model", None) or getattr(model, "model", None)


def _free_memory() -> None:
    """Before the before/after loads two more models: the trained one and its optimizer go."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _reward(settings: RLSettings, tokenizer: Any, backend: TransformersBackend,
            items: dict[str, Any], split: Split, stops: Any) -> Any:
    from userturn.train.rewards import CollabReward, ProbeReward

    if settings.method.reward == "probe":
        header = derive_markers(backend.template).assistant_header.strip()
        return ProbeReward(tokenizer, stops, header,
                           restatement_penalty=settings.method.restatement_penalty,
                           drift_penalty=settings.method.drift_penalty,
                           length_penalty=settings.method.length_penalty,
                           free_tokens=settings.method.free_tokens)
    method = settings.method
    return CollabReward(items, split.train.scorer, backend, follow_weight=method.follow_weight,
                        token_weight=method.token_weight, samples=method.collab_samples,
                        user_max_tokens=settings.probe.user_max_tokens, seed=settings.training.seed)


def _training_record(trainer: Any, seconds: float) -> dict[str, Any]:
    history = [dict(h) for h in trainer.state.log_history]
    losses = [h["loss"] for h in history if "loss" in h]
    if losses and not all(math.isfinite(x) for x in losses):
        raise TrainingError(f"the training loss is not finite: {losses}")
    return {"seconds": round(seconds, 1), "steps": trainer.state.global_step,
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None, "log_history": history}


def _save(trainer: Any, tokenizer: Any, out: Path, training: Training) -> Path:
    """The adapter (LoRA) and a merged, plain model folder every backend can load."""
    checkpoint = out / "model"
    model = trainer.model
    if not training.full:
        model.save_pretrained(out / "adapter")
        model = model.merge_and_unload()
    model.save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    return checkpoint


def _manifest(settings: TrainSettings, kind: str, ref: Any, split: Split, data: dict[str, Any],
              training: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "base_model": settings.training.model, "base_revision": ref.revision,
            "settings": settings.model_dump(mode="json"), "seed": settings.training.seed,
            "items": {"dataset": settings.training.dataset,
                      "eval": [i.id for i in split.eval.items],
                      "eval_sha256": _items_hash(split.eval.items),
                      "train": [i.id for i in split.train.items],
                      "dropped_repeating_eval": list(split.dropped)},
            "data": data, "training": training,
            "versions": versions(("torch", "transformers", "tokenizers", "trl", "peft")),
            "adapter": None if settings.training.full else "adapter", "checkpoint": "model"}


def _items_hash(items: Any) -> str:
    """What the items say, not just their ids (file ids are positions)."""
    text = json.dumps([[i.id, [dict(m) for m in i.messages], i.reference] for i in items])
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _finish(settings: TrainSettings, out: Path, manifest: dict[str, Any], split: Split,
            checkpoint: Path, progress: Progress | None, log: Callable[[str], None], *,
            how: str | None) -> Outcome:
    manifest["signal"] = how  # what the classifier did in training (None: nothing)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str), encoding="utf-8")
    log(f"trained in {manifest['training']['seconds']:.0f} s "
        f"({manifest['training']['steps']} steps); checkpoint {checkpoint}")
    result = None
    if settings.evaluation.evaluate:
        result = evaluate_checkpoint(out, progress=progress, how=how)
    return Outcome(out, manifest, result)


def evaluate_checkpoint(out: Path, *, progress: Progress | None = None,
                        how: str | None = "") -> BeforeAfter:
    """The before/after of a finished training folder (re-runnable: the probe runs resume)."""
    manifest_path = out / MANIFEST
    if not manifest_path.exists():
        raise TrainingError(f"{out} holds no finished training run ({MANIFEST} is missing)")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    kind = manifest["kind"]
    settings = (SFTSettings if kind == "sft" else RLSettings).model_validate(
        {**manifest["settings"], "output": str(out)})
    split = split_dataset(settings.training.dataset, eval_items=settings.training.eval_items,
                          train_items=settings.training.train_items, seed=settings.training.seed)
    if ([i.id for i in split.eval.items] != manifest["items"]["eval"]
            or _items_hash(split.eval.items) != manifest["items"]["eval_sha256"]):
        raise TrainingError(f"the held-out items of {settings.training.dataset} are not those the "
                            "manifest recorded; the dataset changed since training")
    if how == "":  # re-evaluation: what training recorded
        how = manifest.get("signal")
    result = before_after(settings, split.eval, out / manifest["checkpoint"], how=how,
                          progress=progress)
    manifest["evaluation"] = {"rows": summary_rows(result), "note": result.note}
    manifest_path.write_text(json.dumps(manifest, indent=2, default=str), encoding="utf-8")
    return result
