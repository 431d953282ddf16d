"""The user turn's opening as an experiment factor (``user_turn_variants:``).

Does the role header alone carry a model into the user's seat? Each variant changes only the
USER-TURN prompt; the assistant answer is the native one, generated once and shared, so a variant
and ``native`` are measured on the same contexts and pair item by item:

- ``native``: the probe as it is (the model's own template, the experiment's system prompt).
- ``prefill:TEXT``: TEXT written at the start of the opened user turn; the model continues it.
  The prefill is part of the prompt, not of the generated (labelled) text.
- ``system:none``: an empty system message (templates that write a default system text when none
  is given write none); ``system:default``: no system message, so the template's own default, if
  it has one; ``system:TEXT``: TEXT as the system message.
- ``template:FILE``: another template (a .jinja file or a tokenizer_config.json) renders the user
  turn. Where its generation prompt after an assistant message opens a turn other than the
  assistant's (a user header, perhaps with a speaker name), that generation prompt is used;
  otherwise its user turn is opened as the model's own would be. The turn ends at the model's own
  user-turn stops.
- ``warmup:K``: K earlier synthetic user/assistant exchanges before the probed one.

Each variant other than ``native`` is a prober of its own and its own condition: the plan stores
the base model with the variant typed beside it (``user_variant``), the generation key hashes the
name runs before the typed field gave it, and the tables print that name, ``MODEL[user=SPEC]``
(records.probed_name); ``native`` keeps the model's keys of a run without variants. Each variant
against native, paired over items, is :func:`userturn.stats.variants.variant_comparisons`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from userturn.chat.render import ChatTemplate, Prompt, derive_markers, render_user_turn
from userturn.errors import ConfigError, UserturnError
from userturn.records import Generation, Message, Request
from userturn.store.rows import Probed

KINDS = ("native", "prefill", "system", "template", "warmup")
# Synthetic earlier exchanges for warmup:K: short, unambiguous, closed (no open question).
WARMUP = (
    ("What is 7 + 5?", "7 + 5 = 12."),
    ("How many days are in a week?", "A week has 7 days."),
    ("Name a primary colour.", "Red is a primary colour."),
    ("What is 9 times 3?", "9 times 3 is 27."),
    ("Which is larger, 0.5 or 0.25?", "0.5 is larger than 0.25."),
    ("How many minutes are in an hour?", "An hour has 60 minutes."),
    ("What is half of 18?", "Half of 18 is 9."),
    ("Spell the word cat backwards.", "Backwards, cat is tac."),
)


@dataclass(frozen=True)
class UserVariant:
    kind: str
    value: str = ""

    @property
    def spec(self) -> str:
        return self.kind if self.kind == "native" else f"{self.kind}:{self.value}"


def parse_user_variant(text: str, check_file: bool = True) -> UserVariant:
    """``check_file``: a ``template:FILE`` must exist (not for a stored run's settings read back:
    the file was read when the run generated, perhaps on another machine)."""
    kind, colon, value = str(text).partition(":")
    kind = kind.strip()
    if kind not in KINDS:
        raise ConfigError(f"unknown user-turn variant {text!r}: use native, prefill:TEXT, "
                          "system:none|default|TEXT, template:FILE or warmup:K")
    if kind == "native":
        if colon:
            raise ConfigError("the native user-turn variant takes no value")
        return UserVariant("native")
    if not value.strip():
        raise ConfigError(f"the user-turn variant {kind}: needs a value, e.g. {kind}:"
                          + {"prefill": "Thanks", "system": "none", "template": "FILE.jinja",
                             "warmup": "2"}[kind])
    if kind == "warmup":
        if not value.strip().isdigit() or not 1 <= int(value) <= len(WARMUP):
            raise ConfigError(f"warmup:K takes K from 1 to {len(WARMUP)}, not {value!r}")
        return UserVariant(kind, str(int(value)))
    if kind == "template" and check_file and not Path(value).expanduser().is_file():
        raise ConfigError(f"user-turn variant template:{value}: file not found")
    return UserVariant(kind, value)


def parse_user_variants(values: Sequence[str], check_files: bool = True) -> list[UserVariant]:
    variants = [parse_user_variant(v, check_files) for v in values]
    specs = [v.spec for v in variants]
    if len(set(specs)) != len(specs):
        raise ConfigError(f"user_turn_variants lists a variant twice: {specs}")
    return variants


def user_turn_prompt(template: ChatTemplate, messages: Sequence[Message],
                     variant: UserVariant | None = None, thinking: str | None = None,
                     override: ChatTemplate | None = None) -> Prompt:
    """The user-turn prompt of ``messages`` ([system?, ..., user, assistant]) under ``variant``.
    ``override``: the loaded template of a ``template:FILE`` variant."""
    if variant is None or variant.kind == "native":
        return render_user_turn(template, messages, thinking=thinking)
    if variant.kind == "prefill":
        prompt = render_user_turn(template, messages, thinking=thinking)
        return replace(prompt, text=prompt.text + variant.value)
    if variant.kind == "system":
        return render_user_turn(template, _with_system(messages, variant.value), thinking=thinking)
    if variant.kind == "warmup":
        return render_user_turn(template, _with_warmup(messages, int(variant.value)),
                                thinking=thinking)
    assert override is not None, "template: variants need their loaded template"
    return _override_prompt(template, override, messages, thinking)


def _with_system(messages: Sequence[Message], value: str) -> list[Message]:
    rest = [m for m in messages if m["role"] != "system"] if messages[0]["role"] == "system" \
        else list(messages)
    if value == "default":
        return rest
    return [{"role": "system", "content": "" if value == "none" else value}, *rest]


def _with_warmup(messages: Sequence[Message], k: int) -> list[Message]:
    head = [m for m in messages[:1] if m["role"] == "system"]
    earlier: list[Message] = []
    for question, answer in WARMUP[:k]:
        earlier += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return [*head, *earlier, *messages[len(head):]]


def _override_prompt(template: ChatTemplate, override: ChatTemplate,
                     messages: Sequence[Message], thinking: str | None) -> Prompt:
    """The override's own generation prompt where it opens something other than the assistant
    turn (a user header), else its opened user turn; the model's own stops either way."""
    stops = derive_markers(template)
    history = override.render(messages)
    opened = override.render(messages, add_generation_prompt=True)
    generation = opened[len(history):] if opened.startswith(history) else ""
    header = stops.assistant_header.strip()
    if generation.strip() and not (header and header in generation):
        text = opened
    else:
        text = render_user_turn(override, messages, thinking=thinking).text
    return Prompt(text, stops.user_stop, override.hash, stops.assistant_header)


class UserVariantBackend:
    """A probed model under one user-turn variant (``probed``: its base model and the typed
    variant; ``spec``, its name, tells it from the other probers of the run). It generates with
    the base backend and answers with the base model's answers (``answers_as``)."""

    def __init__(self, base: Any, variant: UserVariant) -> None:
        self.base, self.variant = base, variant
        self.probed = probed(base)._replace(user_variant=variant.spec)
        self.spec = self.probed.name
        self.answers_as = getattr(base, "answers_as", base.spec)
        self.revision, self.chunk_size = base.revision, base.chunk_size
        self.template: ChatTemplate = base.template
        self.override = variant_template(base.template, variant)

    def complete(self, requests: Sequence[Request]) -> list[Generation]:
        return self.base.complete(requests)

    def user_prompt(self, messages: Sequence[Message], thinking: str | None = None) -> Prompt:
        return user_turn_prompt(self.template, messages, self.variant, thinking, self.override)


def variant_template(template: ChatTemplate, variant: UserVariant) -> ChatTemplate | None:
    """The template a ``template:FILE`` variant opens the user turn with (the model's own
    special tokens kept); None for every other variant."""
    if variant.kind != "template":
        return None
    from userturn.chat.template_file import load_template_file

    return load_template_file(variant.value, bos=template.bos_token, eos=template.eos_token)


def variant_prompt(template: ChatTemplate, variant: UserVariant,
                   messages: Sequence[Message]) -> Prompt:
    """The probe prompt a model with ``template`` is given under ``variant``: what `userturn
    render` shows, with no model to generate with."""
    return user_turn_prompt(template, messages, variant, None, variant_template(template, variant))


def expand_user_variants(backends: Mapping[str, Any], probers: Sequence[str],
                         values: Sequence[UserVariant], check: Sequence[Message]
                         ) -> tuple[dict[str, Any], list[str]]:
    """The backends with every prober split into its user-turn variants (parsed with the plan),
    and the new probers. ``check``: a conversation each variant must render (misuse fails
    before the run starts)."""
    if not values:
        return dict(backends), list(probers)
    variants = list(values)
    if all(v.kind != "native" for v in variants):  # what every variant is paired with
        variants.insert(0, UserVariant("native"))
    out, split = dict(backends), []
    for spec in probers:
        for variant in variants:
            if variant.kind == "native":
                split.append(spec)
                continue
            backend = UserVariantBackend(backends[spec], variant)
            try:
                backend.user_prompt(check)
            except UserturnError as exc:
                raise ConfigError(f"user-turn variant {variant.spec} on {spec}: {exc}") from None
            out[backend.spec] = backend
            split.append(backend.spec)
    return out, split


def probed(backend: Any) -> Probed:
    """What the plan stores of a prober: its base model and the variants it is probed under
    (a plain backend: its spec, native, the template's default thinking)."""
    return getattr(backend, "probed", None) or Probed(backend.spec)


def answers_as(backend: Any) -> str:
    """The model whose answers a prober answers with: its own, or (a user-turn variant) its base
    model's, so that every variant is probed on the same answers as native."""
    return getattr(backend, "answers_as", backend.spec)


def user_prompt_of(backend: Any, messages: Sequence[Message], thinking: str | None) -> Prompt:
    """A prober's user-turn prompt: its variant's, or the native one."""
    variant_prompt = getattr(backend, "user_prompt", None)
    if variant_prompt is not None:
        return variant_prompt(messages, thinking)
    return render_user_turn(backend.template, messages, thinking=thinking)


def variant_meta(backend: Any) -> dict[str, Any]:
    """What the run metadata records of a variant model."""
    variant = getattr(backend, "variant", None)
    if variant is None:
        return {}
    meta: dict[str, Any] = {"user_turn_variant": variant.spec, "base_model": backend.answers_as}
    if backend.override is not None:
        meta["user_turn_template_hash"] = backend.override.hash
    return meta
