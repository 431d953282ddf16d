"""The values that flow through the probe: items, generations, labels, scores.

Plain frozen dataclasses: they are compared, hashed and stored, never mutated.
Messages are plain ``{"role": ..., "content": ...}`` dicts, as every chat template expects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, get_args

Message = Mapping[str, str]

LabelName = Literal[
    "follow_up", "generic", "new_query", "restatement", "assistant_drift", "meta", "empty"
]
LABELS: tuple[str, ...] = (
    "follow_up", "generic", "new_query", "restatement", "assistant_drift", "meta", "empty"
)
FinishReason = Literal["stop", "length", "error"]
# The offline labellers a run can name; labels.sources.source_order says where each decides.
Labeller = Literal["cascade", "classifier", "rules"]
LABELLERS: tuple[Labeller, ...] = get_args(Labeller)
# Which turns a judge is asked about (labels.stages).
JudgeScopeName = Literal["undecided", "uncertain", "all"]
HUMAN = "human"  # the pseudo-model whose user turns are the data's real next user turns
# How a long stage reports progress: (description, total) -> advance(n); the CLI draws bars.
Progress = Callable[[str, int], Callable[[int], None]]


def silent_progress(description: str, total: int) -> Callable[[int], None]:
    """Progress that shows nothing (the library's default)."""
    return lambda n: None


@dataclass(frozen=True)
class Item:
    """One dataset row: the conversation so far (ending in the user query) and its reference."""

    id: str
    messages: tuple[Message, ...]
    reference: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    data_answer: str | None = None
    """The data's own assistant reply to the last user message, where the data has one."""
    next_user_turn: str | None = None
    """The real next user message, where the data has one: the human baseline."""

    @property
    def query(self) -> str:
        for message in reversed(self.messages):
            if message["role"] == "user":
                return message["content"]
        raise ValueError(f"item {self.id} has no user message")


@dataclass(frozen=True)
class GenerationParams:
    """Decoding parameters of one completion. temperature 0 means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class Request:
    """One completion of a raw prompt: one sample, with its own seed."""

    prompt: str
    params: GenerationParams
    stop: tuple[str, ...] = ()
    seed: int = 0
    # A JSON schema (as JSON text) the completion must follow, for engines with constrained
    # decoding (vLLM, llama.cpp: backends/constraints.py); None for the probe's own turns.
    constraint: str | None = None


@dataclass(frozen=True)
class Generation:
    """What a backend returned for one request. A failure is data: ``error`` is set, text empty."""

    text: str
    raw_text: str
    finish_reason: FinishReason
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    # A reasoning model's thinking, split out of the raw text by the pipeline (``text`` is then
    # the visible part only). None: the turn has no thinking; "": an empty thinking block.
    thinking: str | None = None


@dataclass(frozen=True)
class Case:
    """What a classifier sees: the query, the assistant's answer and the generated user turn.

    ``raw_user_turn`` keeps special tokens (thinking removed); ``assistant_header`` is the template's assistant role
    header (for example ``<|im_start|>assistant``), whose appearance means the model spoke as the
    assistant.
    """

    query: str
    answer: str
    user_turn: str
    raw_user_turn: str = ""
    assistant_header: str = ""
    # The turn's thinking, kept apart: classifiers label the visible ``user_turn`` only, and a
    # turn that is thinking only is ``empty``.
    thinking: str = ""


@dataclass(frozen=True)
class Label:
    """One classification of a user turn. ``label`` None means the source could not decide."""

    label: LabelName | None
    source: str
    rationale: str = ""
    error: str | None = None
    # How sure the source is of ``label`` (a learned classifier's calibrated probability);
    # None where the source gives none (rules, judges, people).
    probability: float | None = None


@dataclass(frozen=True)
class Score:
    """Task accuracy of one assistant answer."""

    correct: bool
    extracted: str | None
    reference: str | None
    # Further metrics of the same answer, e.g. IFEval's loose and instruction-level accuracy.
    details: Mapping[str, Any] = field(default_factory=dict)
