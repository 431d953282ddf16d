"""The continuation arm: the conversation closed as the template closes a past turn, no header
opened, and the model left to go on by itself.

The probe as the paper runs it (the ``opened`` arm, :func:`~userturn.chat.render.render_user_turn`)
opens the USER header itself. Here the prompt is that same context cut where the probe would open
the header: ``[system?, user q, assistant a]`` with the answer's turn ended exactly as the template
ends a past turn (ChatML's ``<|im_end|>\\n``, Mistral's ``</s>``, harmony's ``<|end|>``; nothing at
all for GLM, whose turns end where the next role tag starts). What the model writes first (a user
header, an assistant header, a system header, plain text, or nothing before its end of sequence),
how likely each header is, and what it writes as the user, is the measurement.

Where a continuation ends. The prompt already ends with the assistant's end-of-turn marker, which
for ChatML and Llama 3 is also the end-of-sequence token; so the engine is told not to stop at its
end-of-sequence ids (``past_end``) but only at :attr:`ContinuationMarkers.stop`: the markers that
close a user turn (as the probe cuts one), the assistant's end-of-turn and the end-of-sequence
texts. The first of them that the model writes either closes the turn it opened, or, written
before any header, says it has nothing more to write (``none``). One kind of end is left out on
purpose: a marker that is part of the user header itself (GLM lists ``<|user|>`` among its
end-of-sequence ids; Nemotron's user turn ends at ``<SPECIAL_11>``, which also opens the header),
since stopping there would end the continuation at the very turn it is meant to show.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal, Sequence, get_args

from userturn.chat.render import (
    SENTINELS,
    ChatTemplate,
    TurnMarkers,
    derive_markers,
    render_user_turn,
)
from userturn.chat.thinking import ThinkingFormat, split_thinking, thinking_format
from userturn.errors import TemplateError
from userturn.records import Message

# What a continuation opens first. ``text``: words outside any turn before any header (where the
# template does not close the answer's turn, GLM, that is the answer going on); ``none``: nothing
# but whitespace and BOS before it ended (at an end marker, the end of sequence or the budget). A
# header of a role outside this set (a tool's) is not a header here: it reads as ``text``.
ContinuationRole = Literal["user", "assistant", "system", "text", "none"]
CONTINUATION_ROLES: tuple[ContinuationRole, ...] = get_args(ContinuationRole)
# The next-role probabilities at the prompt's end: each header, the end of sequence, and
# ``other``, one minus their sum: plain text (more of the answer, where the turn is not closed), a
# header of another role, a header written in another way (other whitespace, other tokens), or an
# end-of-sequence token other than the one scored.
NextRole = Literal["user", "assistant", "end", "other"]
_ROLE_NAME = re.compile(r"\s*[A-Za-z_]{0,20}\s*")  # what may follow a role token in a header


@dataclass(frozen=True)
class ContinuationMarkers:
    """What a template writes between turns, as the continuation arm reads it (whitespace kept)."""

    # As the template opens a user turn after a closed assistant turn; the layout before it
    # (newlines) belongs to the close, so a header starts with what a model writes to open one.
    user_header: str
    assistant_header: str
    system_header: str  # "" where the template has no system turn of its own (Gemma, Mistral)
    user_stop: tuple[str, ...]  # where a user turn ends, as the probe cuts a generated one
    stop: tuple[str, ...]  # where the engine ends a continuation (and nowhere else)
    ends: tuple[str, ...]  # end-of-sequence texts: the template's, then the engine's
    # BOS says nothing before a turn opens (a model that starts a new conversation); "" where
    # it is part of a header (SmolLM2's BOS is <|im_start|>). End markers before a header are
    # stops: the continuation ended there.
    bos: str
    specials: tuple[str, ...]  # the tokenizer's added tokens, removed from a user turn's text
    thinking: ThinkingFormat

    def headers(self) -> tuple[tuple[ContinuationRole, str], ...]:
        """(role, header as matched in generated text: surrounding whitespace off), each role
        whose header the template writes."""
        named: tuple[tuple[ContinuationRole, str], ...] = (
            ("user", self.user_header), ("assistant", self.assistant_header),
            ("system", self.system_header))
        return tuple((role, header.strip()) for role, header in named if header.strip())


@dataclass(frozen=True)
class ContinuationPrompt:
    """The continuation arm's prompt: the opened arm's prompt up to where it opens the user
    header. ``stop``: the engine's only stop strings (``past_end``: none of its end-of-sequence
    ids stop it unless one is here)."""

    text: str
    stop: tuple[str, ...]
    template_hash: str
    system: str  # what became of the system message, as the opened arm's prompt says
    markers: ContinuationMarkers


@dataclass(frozen=True)
class ParsedContinuation:
    """What a continuation opened, with offsets into the text it was parsed from: the role's
    header spans ``[header_at, content_at)``, what the role says ``[content_at, end_at)``
    (for ``text`` and ``none`` there is no header: ``header_at == content_at``)."""

    role: ContinuationRole
    user_turn: str | None  # the user turn as the probe strips one; None unless role is user
    thinking: str | None  # the user turn's thinking, where it wrote a thinking block
    header_at: int
    content_at: int
    end_at: int
    closed: bool  # ended at a marker, not cut by the token budget


def continuation_markers(template: ChatTemplate, ends: Sequence[str] = ()) -> ContinuationMarkers:
    """The continuation arm's markers for ``template``. ``ends``: the engine's end-of-sequence
    texts beyond the template's own ``eos_token`` (Llama 3's ``<|end_of_text|>``); pass the
    same ones when parsing what the engine wrote."""
    turns = derive_markers(template)
    close, user_header = _split_assistant_to_user(template, turns)
    if not user_header.strip():
        raise TemplateError(f"chat template of {template.model} writes no user header after an "
                            "assistant turn: a continuation cannot show who speaks next")
    assistant_end = turns.assistant_end.strip()
    # [INST]-style templates write no assistant header: the answer follows the user's [/INST].
    assistant_header = turns.assistant_header if turns.assistant_header.strip() \
        else turns.user_end_marker
    headers = (user_header, assistant_header, _system_header(template, user_header))
    ending = [e for e in _unique([template.eos_token or "", *ends]) if e not in user_header]
    closing = [piece for piece, special in template.lexer.pieces(close) if special]
    stop = [s for s in (*turns.user_stop, assistant_end, *closing, *ending)
            if s and s not in user_header]
    # A BOS that is also an end (Qwen2.5's <|endoftext|> starts a sequence and ends a
    # generation) is read as an end: a model that writes it has stopped.
    bos = template.bos_token or ""
    if any(bos in h for h in headers) or bos in ending:
        bos = ""
    return ContinuationMarkers(user_header, assistant_header, headers[2], turns.user_stop,
                               _unique(stop), tuple(ending), bos,
                               template.special_tokens, thinking_format(template.source))


def render_continuation(template: ChatTemplate, messages: Sequence[Message],
                        thinking: str | None = None, ends: Sequence[str] = ()
                        ) -> ContinuationPrompt:
    """``[system?, user, assistant]`` rendered through the end of the assistant's turn, as the
    template ends a past turn: the opened arm's prompt (:func:`render_user_turn`, with the same
    ``thinking`` policy and system placement) without the user header it opens. A template that
    writes a finished conversation's last turn otherwise (Phi-3 adds EOS after it, gpt-oss ends
    it with ``<|return|>``) does not change this prompt: a past turn is ended as in the probe.

    Raises TemplateError naming the model where the opened prompt does not end with the header."""
    opened = render_user_turn(template, messages, thinking=thinking)
    markers = continuation_markers(template, ends)
    if not opened.text.endswith(markers.user_header):
        raise TemplateError(f"chat template of {template.model}: the probe's prompt does not end "
                            f"with the user header {markers.user_header!r}; cannot tell where "
                            "the assistant's turn ends")
    text = opened.text[:len(opened.text) - len(markers.user_header)]
    return ContinuationPrompt(text, markers.stop, opened.template_hash, opened.system, markers)


def parse_continuation(markers: ContinuationMarkers, text: str) -> ParsedContinuation:
    """Which role ``text`` (a continuation's raw text, special tokens kept, as the engine ended
    it) opened first, and, for a user turn, the turn cut at the user end-of-turn marker.

    The continuation ends at its first stop marker, as the engine ends it: a header written
    before that opens a turn (unless words come first: ``text``); none written, it is ``text``
    or ``none``. Never raises: any string parses."""
    stop_at, _ = _first(text, markers.stop)
    header_at, role, header = _first_header(markers, text)
    if role is None or header_at > stop_at:
        first = _skip_blank(text, stop_at, markers.bos)
        said: ContinuationRole = "text" if first < stop_at else "none"
        return ParsedContinuation(said, None, None, first, first, stop_at, stop_at < len(text))
    first = _skip_blank(text, header_at, markers.bos)
    if first < header_at:
        return ParsedContinuation("text", None, None, first, first, header_at, True)
    written = {"user": markers.user_header, "assistant": markers.assistant_header,
               "system": markers.system_header}[role].lstrip()
    content_at = header_at + (len(written) if text.startswith(written, header_at)
                              else len(header))
    # Where the engine stopped ends any turn; a user turn also ends where the probe cuts one.
    closers = (*markers.user_stop, *markers.stop) if role == "user" else markers.stop
    end_at, closer = _first(text, closers, content_at)
    if role != "user":
        return ParsedContinuation(role, None, None, header_at, content_at, end_at, bool(closer))
    thought, visible = split_thinking(text[content_at:end_at], markers.thinking)
    for token in markers.specials:
        visible = visible.replace(token, "")
    return ParsedContinuation("user", visible.strip(), thought, header_at, content_at, end_at,
                              bool(closer))


def next_role_options(markers: ContinuationMarkers) -> tuple[tuple[NextRole, str], ...]:
    """The continuations of the prompt whose probabilities are the next-role probabilities, as
    (role, option) pairs for a backend's ``score_options(prompt, options, whole=True)``:
    ``user``, the user header as the template writes it after a closed turn; ``assistant``, the
    assistant header; ``end``, once for each end-of-sequence text (the template's and the
    engine's: Qwen2.5 ends a generation at ``<|im_end|>`` or ``<|endoftext|>``; their
    probabilities add up). Trailing whitespace is left off (it is layout, and a token of its own
    would be scored). A role whose header the template does not write has no entry; ``other`` is
    what the entries leave (:func:`next_role_probabilities`).
    Raises TemplateError where one option begins another: their probabilities would overlap."""
    options: list[tuple[NextRole, str]] = [
        ("user", markers.user_header.rstrip()), ("assistant", markers.assistant_header.strip()),
        *(("end", end) for end in markers.ends)]
    options = [(role, option) for role, option in options if option.strip()]
    for index, (name, option) in enumerate(options):
        for other_index, (other, longer) in enumerate(options):
            if other_index != index and longer.startswith(option):
                # Then P(option) counts P(longer) again: the probabilities would not add up.
                raise TemplateError(f"the next-role options {name} ({option!r}) and {other} "
                                    f"({longer!r}) overlap; their probabilities cannot be told "
                                    "apart")
    return tuple(options)


def next_role_probabilities(names: Sequence[str], logprobs: Sequence[float]
                            ) -> dict[str, float]:
    """The next-role probabilities from the options' log-probabilities (in the order of
    ``names``, the roles of :func:`next_role_options`; a role named twice, ``end``, sums its
    options), with ``other``, one minus their sum (never below zero: rounding)."""
    if len(names) != len(logprobs) or not set(names) <= set(get_args(NextRole)) - {"other"}:
        raise ValueError(f"next-role log-probabilities {list(logprobs)} do not match the "
                         f"options {list(names)}")
    probabilities = {role: 0.0 for role in get_args(NextRole)}
    for name, logprob in zip(names, logprobs):
        probabilities[name] += math.exp(logprob)
    probabilities["other"] = max(0.0, 1.0 - sum(probabilities.values()))
    return probabilities


def _unique(values: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(v for v in values if v))


def _split_assistant_to_user(template: ChatTemplate, turns: TurnMarkers) -> tuple[str, str]:
    """What a template writes between the answer and the next user message, cut into (what
    closes the past assistant turn, the user header): the close is every end marker and all the
    whitespace before the header's first piece. Whole pieces, so that the header is what a model
    writes to open the turn: gpt-oss ends a conversation's last answer with ``<|return|>`` but a
    past one with ``<|end|>``, as it ends every message; command-a closes with
    ``<|END_RESPONSE|><|END_OF_TURN_TOKEN|>``; Nemotron with ``\n<SPECIAL_12>\n\n``."""
    to_user = turns.assistant_to_user
    ends = {turns.assistant_end.strip(), turns.user_end.strip(), template.eos_token or ""}
    at = 0
    for piece, special in template.lexer.pieces(to_user):
        if not (piece.isspace() or special and piece in ends):
            break
        at += len(piece)
    at += len(to_user[at:]) - len(to_user[at:].lstrip())
    return to_user[:at], to_user[at:]


def _system_header(template: ChatTemplate, user_header: str) -> str:
    """The system turn's header as the template writes it, where it has a system turn of its
    own: the user header with its role name made ``system`` (ChatML, Llama 3, Phi-3, Kimi,
    command-a), else the last special token before the system text with at most a role name
    after it (``[SYSTEM_PROMPT]``, Nemotron's ``<SPECIAL_10>System``), when that is neither BOS
    nor the user header (Gemma 3 and Mistral write the text into a user turn). Read from a
    render with a system message; "" where it shows none."""
    system = SENTINELS[0]
    try:
        rendered = template.render([{"role": "system", "content": system},
                                    {"role": "user", "content": SENTINELS[1]}])
    except TemplateError:  # the template refuses a system role
        return ""
    before = rendered[:rendered.find(system)] if system in rendered else ""
    swapped = user_header.replace("user", "system").replace("User", "System").replace(
        "USER", "SYSTEM")  # Kimi: <|im_user|>user<|im_middle|> -> <|im_system|>system<|im_middle|>
    if swapped != user_header and swapped.strip() in before:
        return swapped
    pieces = template.lexer.pieces(before)
    last = max((i for i, (_, special) in enumerate(pieces) if special), default=None)
    if last is None or pieces[last][0] == template.bos_token:
        return ""
    header = "".join(piece for piece, _ in pieces[last:])
    role_name = _ROLE_NAME.fullmatch(header[len(pieces[last][0]):])
    return header if role_name and header.strip() != user_header.strip() else ""


def _first(text: str, needles: Sequence[str], start: int = 0) -> tuple[int, str]:
    """(where the first of ``needles`` starts at or after ``start``, which one: the longest of
    those starting there); (len(text), "") when none occurs."""
    found = [(at, -len(n), n) for n in needles if n and (at := text.find(n, start)) >= 0]
    if not found:
        return len(text), ""
    at, _, needle = min(found)
    return at, needle


def _first_header(markers: ContinuationMarkers, text: str
                  ) -> tuple[int, ContinuationRole | None, str]:
    found = [(at, -len(header), role, header) for role, header in markers.headers()
             if (at := text.find(header)) >= 0]
    if not found:
        return len(text), None, ""
    at, _, role, header = min(found)
    return at, role, header


def _skip_blank(text: str, limit: int, bos: str) -> int:
    """The first position of ``text`` (up to ``limit``) that is neither whitespace nor BOS."""
    at = 0
    while at < limit:
        if text[at].isspace():
            at += 1
        elif bos and text.startswith(bos, at):
            at += len(bos)
        else:
            break
    return min(at, limit)
