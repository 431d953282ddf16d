"""Rendering the probe with the model's own chat template, and opening a USER turn.

Chat templates are written to open an assistant turn. We never hand-write a template per model:
we render the model's own template with a unique sentinel as the content of a final user message,
cut at the sentinel, and check the result. The turn markers (where a user turn ends, what the
assistant header looks like) are derived the same way, from sentinel conversations, because they
differ between families and often differ from ``eos_token``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from userturn.chat.template_tokens import TokenLexer
from userturn.chat.thinking import thinking_block, thinking_format
from userturn.errors import TemplateError
from userturn.records import Message

# Plain ASCII letters and digits: survives trim, escaping and every template we know unchanged.
SENTINELS = ("qZ7userturnSentinelA", "qZ7userturnSentinelB", "qZ7userturnSentinelC")
THINKING_SENTINEL = "qZ7userturnSentinelT"
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)


@dataclass(frozen=True)
class ChatTemplate:
    """A model's chat template source plus the special tokens it refers to."""

    source: str
    model: str
    bos_token: str | None = None
    eos_token: str | None = None
    # Extra template variables, e.g. {"enable_thinking": False} for Qwen3-style templates.
    variables: Mapping[str, Any] = field(default_factory=dict)
    # The tokenizer's added tokens, where known: markers are cut at these exactly. Not part of
    # the hash (they do not change the render).
    special_tokens: tuple[str, ...] = ()

    @property
    def lexer(self) -> TokenLexer:
        return _lexer(self.special_tokens)

    @property
    def hash(self) -> str:
        # Variables change the render (enable_thinking), so they are part of the hash; a template
        # without variables keeps the hash of its source alone, as stores written before had it.
        text = self.source
        if self.variables:
            text += json.dumps(dict(self.variables), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, model: str, **variables: Any) -> ChatTemplate:
        source = getattr(tokenizer, "chat_template", None)
        if isinstance(source, dict):  # several named templates: the probe uses the default one
            source = source.get("default")
        if not source:
            raise TemplateError(f"model {model} has no chat template; userturn probes chat models")
        return cls(
            source=source,
            model=model,
            bos_token=tokenizer.bos_token,
            eos_token=tokenizer.eos_token,
            variables=dict(variables),
            special_tokens=added_tokens(tokenizer),
        )

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
        """Render exactly as transformers' ``apply_chat_template(tokenize=False)`` would, in
        its environment made bounded (:mod:`userturn.chat.sandbox`): a template's loops,
        values and time are on a budget, so a hostile or broken one stops in one line
        instead of running for hours or filling the memory."""
        import jinja2

        from userturn.chat.sandbox import render_template

        special = {"bos_token": self.bos_token or "", "eos_token": self.eos_token or ""}
        try:
            return render_template(self.source, messages, add_generation_prompt, **special,
                                   **dict(self.variables))
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template of {self.model} failed: {exc}") from exc
        except Exception as exc:
            # A template is a program from a file or a hub: whatever it raises while rendering
            # ({{ 1/0 }}, a type error, a range past the sandbox's limit, a budget spent) is
            # the template's fault, said in one line, never a traceback.
            raise TemplateError(f"chat template of {self.model} failed: "
                                f"{type(exc).__name__}: {exc}") from exc


@dataclass(frozen=True)
class TurnMarkers:
    """Role markers of a template, derived from sentinel renders (whitespace kept)."""

    user_end: str  # text a template puts after a user message, e.g. "<|im_end|>\n"; may be ""
    assistant_header: str  # e.g. "<|im_start|>assistant\n"; "" for [INST]-style templates
    assistant_end: str  # after a final assistant message, e.g. "<|im_end|>\n"
    assistant_to_user: str  # what closes an assistant turn and opens a user turn
    user_header: str = ""  # e.g. "<|im_start|>user\n"
    # Where a generated user turn ends: the user end-of-turn (``<|im_end|>``), or, where the
    # template has none, the first special token of the assistant header that follows
    # (``<|assistant|>``, Nemotron's ``<SPECIAL_11>`` before the plain-text role name).
    user_end_marker: str = ""
    assistant_end_marker: str = ""  # the same for an assistant turn (``<|user|>`` for GLM)

    @property
    def user_stop(self) -> tuple[str, ...]:
        """Strings that end a generated user turn: the end marker, then the assistant header."""
        return _unique([self.user_end_marker or self.assistant_header.strip(),
                        self.assistant_header.strip()])

    @property
    def assistant_stop(self) -> tuple[str, ...]:
        """The assistant end-of-turn, else (templates without one) the next user header."""
        return _unique([self.assistant_end_marker or self.assistant_end.strip()
                        or self.user_header.strip()])


@dataclass(frozen=True)
class Prompt:
    """An exact prompt for a backend, with the markers that end the turn it opens."""

    text: str
    stop: tuple[str, ...]
    template_hash: str
    assistant_header: str
    system: str = "none"  # what happened to the system message: one of SYSTEM_VERDICTS

    @property
    def system_merged(self) -> bool:
        """userturn (not the template as it renders this prompt) placed the system text."""
        return self.system in (SYSTEM_MERGED, SYSTEM_MOVED)


# What became of the system message, in the words `render` and the run metadata use.
SYSTEM_NONE = "none"
SYSTEM_KEPT = "kept (the template renders it as a system block)"
SYSTEM_MERGED = "merged into the first user message (the template refuses a system role)"
SYSTEM_MERGED_BY_TEMPLATE = "merged into the first user message by the template"
SYSTEM_MOVED = ("moved to the last user message, as the template does: rendered in the query "
                "the model answered, not in the opened user turn")
SYSTEM_DROPPED = "dropped by the template (it does not render the system text)"
SYSTEM_VERDICTS = (SYSTEM_NONE, SYSTEM_KEPT, SYSTEM_MERGED, SYSTEM_MERGED_BY_TEMPLATE,
                   SYSTEM_MOVED, SYSTEM_DROPPED)


@functools.lru_cache(maxsize=32)
def _lexer(special_tokens: tuple[str, ...]) -> TokenLexer:
    # Built once per vocabulary: every render derives the markers again.
    return TokenLexer(special_tokens)


def added_tokens(tokenizer: Any) -> tuple[str, ...]:
    """The tokenizer's added tokens (special or not: each is one token either way)."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    tokens = [getattr(t, "content", str(t)) for t in decoder.values()]
    return tuple(sorted({t for t in tokens if t and not t.isspace()}))


def _unique(values: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(v for v in values if v))


def _between(text: str, start: str, end: str | None) -> str:
    begin = text.index(start) + len(start)
    return text[begin:] if end is None else text[begin:text.index(end, begin)]


def derive_markers(template: ChatTemplate) -> TurnMarkers:
    a, b, c = SENTINELS
    turns = [{"role": "user", "content": a}, {"role": "assistant", "content": b},
             {"role": "user", "content": c}]
    three = template.render(turns)
    opened = template.render(turns, add_generation_prompt=True)
    two = template.render(turns[:2])
    if not all(s in three for s in SENTINELS) or b not in two:
        raise TemplateError(
            f"chat template of {template.model} drops or rewrites message content; "
            "it cannot render a user turn after an assistant turn"
        )
    lexer = template.lexer
    user_end = _drop_final_eos(_between(three, c, None), template.eos_token)
    assistant_end = _drop_final_eos(_between(two, b, None), template.eos_token)
    user_to_assistant = _between(three, a, b)
    if user_end.strip() and user_end == user_to_assistant:
        # The template writes the assistant header after EVERY user message (so it follows the
        # sentinel too): the end-of-turn is what user and assistant turns end with alike, cut
        # between tokens; none (DeepSeek-R1: "<｜Assistant｜>" vs "<｜end▁of▁sentence｜>").
        user_end = lexer.common_prefix(user_end, assistant_end)
        if not user_end.strip():
            user_end = ""
    header = user_to_assistant[len(user_end):] if user_to_assistant.startswith(user_end) else ""
    header = header or user_to_assistant
    # The generation prompt may say more than history does (an empty think block, gpt-oss's
    # channel), or otherwise (GLM-4.7: "</think>" in history, "<think>" when generating): the
    # header proper is what both agree on, whole tokens only, and never a thinking tag.
    generated = _between(opened, c, None)
    generated = generated[len(user_end):] if generated.startswith(user_end) else generated
    header = lexer.common_prefix(header, generated) or header
    header = lexer.before_thinking(header) or header
    to_user = _between(three, b, c)
    user_header = to_user[len(assistant_end):] if to_user.startswith(assistant_end) else to_user
    markers = TurnMarkers(
        user_end=user_end,
        assistant_header=header,
        assistant_end=assistant_end,
        assistant_to_user=to_user,
        user_header=user_header,
        user_end_marker=user_end.strip() or lexer.first_special(header),
        assistant_end_marker=assistant_end.strip() or lexer.first_special(user_header),
    )
    if not markers.user_stop:
        # Nothing to stop at: the model would write past its user turn into the next answer.
        raise TemplateError(f"chat template of {template.model} marks no roles: neither an "
                            "end of the user turn nor an assistant header shows in what it "
                            "writes, so userturn cannot tell where a generated user turn ends")
    check_whole_tokens(template.model, lexer, (*markers.user_stop, *markers.assistant_stop))
    return markers


def check_whole_tokens(model: str, lexer: TokenLexer, stops: Sequence[str]) -> None:
    """A stop that ends inside a token never matches where the model ends its turn: refuse it
    loudly rather than let every turn run on."""
    for stop in stops:
        inside = lexer.ends_inside_token(stop)
        if inside is not None:
            raise TemplateError(f"chat template of {model}: the derived stop marker {stop!r} ends "
                                f"inside the token {inside!r}; userturn cannot tell where a turn "
                                "ends")


def _drop_final_eos(text: str, eos: str | None) -> str:
    """Some templates (Phi-3) write EOS after the last message of a finished conversation; that
    EOS ends the document, not the turn. Keep it when it IS the end-of-turn (ChatML, Llama 3)."""
    stripped = text.rstrip()
    if eos and stripped.endswith(eos) and stripped[: -len(eos)].strip():
        return stripped[: -len(eos)]
    return text


def visible_text(content: str) -> str:
    """Assistant content as templates show it in history: thinking removed."""
    content = _THINK_BLOCK.sub("", content)
    if "</think>" in content:  # a block whose opening tag was in the prompt
        content = content.split("</think>", 1)[1]
    return content.strip()


def _render_with_system_fallback(
    template: ChatTemplate, messages: Sequence[Message], add_generation_prompt: bool
) -> tuple[str, bool]:
    """Render; if the template refuses a system role, merge the system text into the first user
    message (what templates without a system role document users to do)."""
    try:
        return template.render(messages, add_generation_prompt), False
    except TemplateError:
        if not messages or messages[0]["role"] != "system":
            raise
    merged = merge_system(messages)
    return template.render(merged, add_generation_prompt), True


def merge_system(messages: Sequence[Message], into_last: bool = False,
                 joined: str | None = None) -> list[Message]:
    """The conversation without its system message, the system text written before the first
    (or, ``into_last``, the last) user message's content: ``joined`` as the template writes it,
    else followed by a blank line."""
    system, rest = messages[0]["content"], [dict(m) for m in messages[1:]]
    users = [m for m in rest if m["role"] == "user"]
    if users and system.strip():  # an empty system message merges as nothing
        target = users[-1] if into_last else users[0]
        target["content"] = (joined if joined is not None else f"{system}\n\n") + target["content"]
    return rest


def _system_as_template_joins_it(template: ChatTemplate, system: str) -> str | None:
    """What a template that moves the system text into a user message writes before that
    message's content (Mistral-Nemo: the text and a blank line), read from two sentinel
    renders; None when the two renders do not differ by such an insertion."""
    probe = {"role": "user", "content": SENTINELS[0]}
    try:
        bare = template.render([probe])
        with_system = template.render([{"role": "system", "content": system}, probe])
    except TemplateError:
        return None
    before, after = bare.split(SENTINELS[0])[0], with_system.split(SENTINELS[0])[0]
    inserted = after[len(before):] if after.startswith(before) else ""
    return inserted if system.strip() in inserted else None


def _system_verdict(prefix: str, messages: Sequence[Message], markers: TurnMarkers,
                    merged: bool) -> str:
    """What the rendered prompt did with the system message, in plain words."""
    if not messages or messages[0]["role"] != "system" or not messages[0]["content"].strip():
        return SYSTEM_NONE
    if merged:
        return SYSTEM_MERGED
    system = messages[0]["content"].strip()
    if system not in prefix:
        return SYSTEM_DROPPED
    user_header = markers.user_header.strip()
    first_user = prefix.find(user_header) if user_header else -1
    if 0 <= first_user < prefix.find(system):
        return SYSTEM_MERGED_BY_TEMPLATE
    return SYSTEM_KEPT


def render_assistant_turn(template: ChatTemplate, messages: Sequence[Message]) -> Prompt:
    """The ordinary prompt: the conversation so far, then the template's assistant header."""
    if not messages or messages[-1]["role"] != "user":
        raise TemplateError("an assistant-turn prompt needs a conversation ending in a user message")
    markers = derive_markers(template)
    text, merged = _render_with_system_fallback(template, messages, add_generation_prompt=True)
    return Prompt(text, markers.assistant_stop, template.hash, markers.assistant_header,
                  _system_verdict(text, messages, markers, merged))


# The assistant answer a probe prompt is rendered with before any real answer exists: to check
# that a template can open a user turn before a run starts, to say what it does with the system
# message, and to build the prompt variants. Only the prompt's shape is used, so any short answer
# does; every place that needs one uses this one.
PLACEHOLDER_ANSWER = "42"


def with_placeholder_answer(messages: Sequence[Message]) -> list[Message]:
    """``messages`` (a conversation ending in a user message) answered by ``PLACEHOLDER_ANSWER``."""
    return [*messages, {"role": "assistant", "content": PLACEHOLDER_ANSWER}]


def render_user_turn(template: ChatTemplate, messages: Sequence[Message],
                     thinking: str | None = None) -> Prompt:
    """The probe's prompt: ``[system?, user, assistant]`` rendered, then an OPEN user turn.

    ``thinking`` (the policy ``keep``): the assistant answer's thinking, written into the history
    before the answer in the model's own format, where the template would drop it. None or ""
    leaves the history as the template renders it (the policy ``drop``).

    A system message goes where the template puts it. Templates that write it into the LAST user
    message (Mistral-Nemo) would write it into the opened turn: the prompt is rendered instead as
    the conversation the model answered was, the system text in that query, and ``system`` says so.

    Raises TemplateError naming the model when the template cannot open a user turn, when the
    previous assistant turn is not closed, or when an assistant header would follow.
    """
    if not messages or messages[-1]["role"] != "assistant":
        raise TemplateError("the probe needs a conversation ending in an assistant message")
    if thinking and thinking.strip():
        return _with_kept_thinking(template, messages, thinking.strip())
    markers = derive_markers(template)
    sentinel = SENTINELS[2]
    conversation = [*messages, {"role": "user", "content": sentinel}]
    rendered, merged = _render_with_system_fallback(template, conversation, False)
    if rendered.count(sentinel) != 1:
        raise TemplateError(
            f"chat template of {template.model} cannot open a user turn after an assistant "
            "turn (the final user message is not rendered)"
        )
    prefix = rendered[: rendered.index(sentinel)]
    moved = not merged and _system_moved_into_open_turn(prefix, messages, markers)
    if moved:
        joined = _system_as_template_joins_it(template, messages[0]["content"])
        rendered = template.render([*merge_system(messages, True, joined), conversation[-1]])
        prefix = rendered[: rendered.index(sentinel)]
    _check_open_user_turn(template.model, prefix, messages[-1]["content"], markers)
    verdict = SYSTEM_MOVED if moved else _system_verdict(prefix, messages, markers, merged)
    return Prompt(prefix, markers.user_stop, template.hash, markers.assistant_header, verdict)


def _with_kept_thinking(template: ChatTemplate, messages: Sequence[Message],
                        thinking: str) -> Prompt:
    """Render with a sentinel in front of the answer, then put the thinking where it stands:
    templates strip thinking from history, so it cannot be passed through them."""
    answer = messages[-1]
    # The answer's own think block (if the caller left one in) is replaced by ``thinking``.
    marked = [*messages[:-1],
              {**answer, "content": THINKING_SENTINEL + visible_text(answer["content"])}]
    prompt = render_user_turn(template, marked)
    before, marker = thinking_block(thinking_format(template.source), thinking)
    at = prompt.text.find(THINKING_SENTINEL)
    if prompt.text.count(THINKING_SENTINEL) != 1 or not prompt.text[:at].endswith(marker):
        raise TemplateError(f"chat template of {template.model}: cannot keep the thinking in the "
                            "history (the answer is not rendered where the thinking would go)")
    text = prompt.text[:at - len(marker)] + before + prompt.text[at + len(THINKING_SENTINEL):]
    return Prompt(text, prompt.stop, prompt.template_hash, prompt.assistant_header,
                  prompt.system)


def _system_moved_into_open_turn(prefix: str, messages: Sequence[Message],
                                 markers: TurnMarkers) -> bool:
    if messages[0]["role"] != "system" or not messages[0]["content"].strip():
        return False
    closing = markers.assistant_to_user.strip()
    opened_at = prefix.rfind(closing) if closing else -1
    return opened_at >= 0 and messages[0]["content"].strip() in prefix[opened_at:]


def _check_open_user_turn(model: str, prefix: str, answer: str, markers: TurnMarkers) -> None:
    """The prompt must close the assistant turn after the answer, open a user turn, and show no
    assistant header after that. The answer is looked for BEFORE the closing marker: a short
    answer ("a") also occurs inside the markers themselves."""
    closing = markers.assistant_to_user.strip()
    closed_at = prefix.rfind(closing) if closing else len(prefix)
    if closed_at < 0:
        raise TemplateError(
            f"chat template of {model}: the assistant turn is not closed before the user turn"
        )
    anchor = visible_text(answer)[-40:]
    if anchor and prefix.rfind(anchor, 0, closed_at) < 0:
        raise TemplateError(
            f"chat template of {model} rewrote the assistant answer; cannot locate it in the prompt"
        )
    header = markers.assistant_header.strip()
    if header and header in prefix[closed_at + len(closing):]:
        raise TemplateError(f"chat template of {model}: an assistant header follows the user turn")


def prompt_token_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a rendered prompt, with BOS exactly once.

    Templates usually write BOS themselves; tokenizing with special tokens on would add a second.
    When the template did not write it but the tokenizer normally adds it, add it once.
    """
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    bos_id, bos = tokenizer.bos_token_id, tokenizer.bos_token
    adds_bos = bos_id is not None and tokenizer("", add_special_tokens=True)["input_ids"][:1] == [bos_id]
    if adds_bos and not (bos and text.startswith(bos)) and ids[:1] != [bos_id]:
        ids.insert(0, bos_id)
    return ids
