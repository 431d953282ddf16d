"""The values that flow through the probe: items, generations, labels, scores, and the read model
of a stored run (Turn, Answer, the Condition that groups turns).

Plain frozen dataclasses: they are compared, hashed and stored, never mutated.
Messages are plain ``{"role": ..., "content": ...}`` dicts, as every chat template expects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, get_args

from userturn.taxonomy import STATUSES as STATUSES
from userturn.taxonomy import TAXONOMY
from userturn.taxonomy import VERDICT_ERROR as VERDICT_ERROR

Message = Mapping[str, str]

# A label is one of LABELS, the names of the taxonomy's rows (userturn.taxonomy) in its order. A
# plain str, not a Literal: the table is the one list of names, and labellers compute labels at
# run time (every labeller checks its verdict against LABELS).
LabelName = str
LABELS: tuple[str, ...] = TAXONOMY.names
FOLLOW_UP_LABELS: frozenset[str] = TAXONOMY.follow_up_labels  # counted in every follow-up rate
FinishReason = Literal["stop", "length", "error"]
# How the probe asks for a user turn (probe.arms): ``opened`` opens the USER header itself and
# has the model fill it; ``continuation`` ends the assistant's turn as the template ends a past
# turn and lets the model go on: who it has speak next is part of the measurement.
Arm = Literal["opened", "continuation"]
ARMS: tuple[Arm, ...] = get_args(Arm)
DEFAULT_ARM: Arm = "opened"
# The variants a model is probed under, typed beside its spec, and their defaults (a run without
# them): the user turn's opening (probe.user_variants) and enable_thinking (on, off, default).
NATIVE = "native"
DEFAULT_THINKING = "default"
# What a continuation opened first (chat.continuation parses it): a user turn, an assistant
# turn, a system turn, text outside any turn, or nothing before it ended.
NextRole = Literal["user", "assistant", "system", "text", "none"]
NEXT_ROLES: tuple[NextRole, ...] = get_args(NextRole)
# The name of an offline labeller: a row of labels.sources.LABELLERS, which checks it (a run
# records it; adding a labeller is a row there, not a name here).
Labeller = str
# The label sources' names, the one place they are written. A source that runs with other
# parameters than the shipped ones is stored as SOURCE:VARIANT (``classifier:form``,
# ``classifier:STEM-DIGEST``), so its labels never pass for the shipped ones'.
RULES_SOURCE = "rules"
CLASSIFIER_SOURCE = "classifier"  # the shipped learned classifier's label source
MAJORITY_SOURCE = "judges:majority"  # two or more judges deciding together (labels.majority)


def probed_name(model: str, user_variant: str = NATIVE, enable_thinking: str = DEFAULT_THINKING) -> str:
    """The name the tables print for a model under its variants (``MODEL[thinking=on][user=SPEC]``),
    which runs before the typed fields stored as the model; the generation key hashes it too."""
    return model + ("" if enable_thinking == DEFAULT_THINKING else f"[thinking={enable_thinking}]") \
        + ("" if user_variant == NATIVE else f"[user={user_variant}]")


def variant_source(source: str, variant: str) -> str:
    """The source name of ``source`` run with other parameters, called ``variant``."""
    return f"{source}:{variant}"


def source_family(source: str) -> str:
    """The source a stored source name is a variant of (itself where it is none)."""
    return source.partition(":")[0]


# Which turns a judge is asked about (labels.stages).
JudgeScopeName = Literal["undecided", "uncertain", "all"]
HUMAN = "human"  # the pseudo-model whose user turns are the data's real next user turns
HUMAN_PREFIX = "human:"  # a person's label source: human:NAME
# How a long stage reports progress: (description, total) -> advance(n); the CLI draws bars.
Progress = Callable[[str, int], Callable[[int], None]]


def silent_progress(description: str, total: int) -> Callable[[int], None]:
    """Progress that shows nothing (the library's default)."""
    return lambda n: None


def is_follow_up(label: str | None) -> bool:
    """Whether a label counts as a genuine follow-up (the taxonomy's ``follow_up`` column)."""
    return label in FOLLOW_UP_LABELS


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
    # Go on past the model's end-of-sequence and end-of-turn tokens (the continuation arm writes
    # what comes after the closed conversation, turns and their ends included): only ``stop``
    # and the token budget end the completion, and ``raw_text`` keeps the special tokens.
    # Not part of a generation's key (store.sqlite.generation_key), so every key stays as it
    # was; a caller that stores past-end completions beside others keys what tells them apart.
    past_end: bool = False


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


# ------------------------------------------------------------------ the read model of a run
# What readers of a stored run get (store.turns.read_turns builds them): plain values, so the
# statistics in stats/ take them without importing the store.

# STATUSES (what a turn without a label is instead) and VERDICT_ERROR (what one source said of a
# turn where its verdict failed) are defined beside the taxonomy, whose names may not take them.
# The one column list of a user turn: the export, the report's user_turns table, the browser.
COLUMNS = ("model", "arm", "user_variant", "enable_thinking", "answerer", "dataset", "perturbation",
           "temperature", "sample_index", "item_id", "context", "query", "answer", "answer_correct",
           "user_turn", "raw_user_turn", "thinking", "finish_reason", "error", "label", "label_source",
           "rationale", "label_error", "status", "next_role", "prompt", "key")


@dataclass(frozen=True)
class StoredLabel:
    """One source's label of a turn as stored (``label`` None: undecided, or invalid with
    ``error``)."""

    source: str
    version: str
    label: str | None
    rationale: str | None
    error: str | None
    probability: float | None = None
    """How sure the source is (the learned classifier's calibrated probability), else None."""

    def record(self, key: str) -> dict[str, Any]:
        return {"key": key, "source": self.source, "version": self.version, "label": self.label,
                "rationale": self.rationale, "error": self.error,
                "probability": self.probability}


@dataclass(frozen=True)
class Turn:
    """One generated user turn of a run, with its context and its labels."""

    model: str
    """The probed model's spec (``human``: the data's real next user turn); :attr:`probed` adds its variants."""
    answerer: str
    """Who wrote the assistant answer: ``self``, ``reference``, ``data`` or a model spec."""
    dataset: str
    perturbation: str
    """The perturbation applied to the answer, ``none`` for the original context."""
    temperature: float
    """Sampling temperature of the user turn; 0 is greedy."""
    sample_index: int
    item_id: str
    context: str
    """Id of the conversation the turn was generated in (item, answerer and perturbation)."""
    key: str
    """The generation's key in the run store."""
    query: str
    """The last user message of the item's conversation."""
    answer: str
    """The assistant answer the turn follows, as shown to the model (perturbed or not)."""
    answer_correct: bool | None
    """Task score of the assistant answer (None: not scored)."""
    user_turn: str
    """The visible text of the generated user turn."""
    raw_user_turn: str
    """The generated text with special tokens (and any thinking) kept."""
    thinking: str | None
    """A reasoning model's thinking, split off the turn (None: no thinking)."""
    finish_reason: str
    error: str | None
    """Why the generation failed (None: it did not)."""
    prompt: str
    """The exact prompt the model continued."""
    label: str | None
    """The resolved label: the first label among the chosen sources (None: none decided)."""
    label_source: str | None
    """Which source gave :attr:`label`."""
    rationale: str | None
    label_error: str | None
    """The first failed verdict (a judge request that failed, a reply outside the label set)
    among the sources ranked above the one that decided (all of them, where none did), else
    None. A failed verdict never stands in for a label: the next source in the order decides."""
    messages: tuple[Message, ...] = ()
    """The item's conversation up to the answer."""
    next_user_turn: str | None = None
    """The data's real next user turn, where the dataset has one."""
    labels: tuple[StoredLabel, ...] = field(default=())
    """Every stored label of the turn, from every source, by source name."""
    arm: str = DEFAULT_ARM
    """How the turn was asked for (:data:`ARMS`): the opened USER header, or a continuation."""
    next_role: str | None = None
    """A continuation's first role (:data:`NEXT_ROLES`); None for the opened arm (and for a
    continuation whose generation failed)."""
    boundary: int | None = None
    """Where, in :attr:`raw_user_turn`, the words of the turn a continuation opened start (after
    its header; for ``text`` and ``none``, the first thing it wrote); None for the opened arm."""
    role_probabilities: Mapping[str, float] | None = None
    """A continuation's next-role probabilities at its prompt's end (``user``, ``assistant``,
    ``end``, ``other``); None for the opened arm or where the backend could not score them."""
    user_variant: str = NATIVE
    """The user turn's opening the model was probed under (``native``, ``prefill:TEXT``, ...)."""
    enable_thinking: str = DEFAULT_THINKING
    """The template's ``enable_thinking`` (``on``, ``off``; ``default``: the template's own)."""

    @property
    def probed(self) -> str:
        """The probed model's name as the tables print it (:func:`probed_name`)."""
        return probed_name(self.model, self.user_variant, self.enable_thinking)

    @property
    def is_user_turn(self) -> bool:
        """Whether there is a user turn to label: every turn of the opened arm, and a
        continuation that opened a user turn."""
        return self.arm == DEFAULT_ARM or self.next_role == "user"

    @property
    def labellable(self) -> bool:
        """Whether labellers read the turn: a generated user turn (not a failed generation, not
        a continuation that opened another role's turn)."""
        return self.error is None and self.is_user_turn

    @property
    def status(self) -> str:
        """The label, or why there is none: ``undecided`` (no source decided: a source whose
        verdict failed decided nothing), ``failed`` (the generation failed) or ``no user turn``
        (a continuation that had another role speak, or nobody)."""
        if self.error is not None:
            return "failed"
        if not self.is_user_turn:
            return "no user turn"
        return self.label or "undecided"

    @property
    def counts_toward_rate(self) -> bool:
        """Whether the turn is in the denominator of a follow-up rate: every generated turn a
        labeller could look at. An undecided turn has not been judged a follow-up (a rate is a
        lower bound until a judge labels it); failed generations are out. A failed verdict
        changes nothing here: the turn counts with the label the next source gave. A
        continuation that opened no user turn counts, as no follow-up: the continuation arm's
        rate is over every continuation (the unforced follow-up rate)."""
        return self.status != "failed"

    @property
    def probability(self) -> float | None:
        """The probability the deciding source gave :attr:`label` (the classifier gives one)."""
        return next((lab.probability for lab in self.labels if lab.source == self.label_source),
                    None)

    @property
    def follow_up(self) -> bool:
        return is_follow_up(self.label)

    def case(self, assistant_header: str = "") -> Case:
        """What a classifier sees. Where thinking was split off, the raw text (which still holds
        it) is replaced by the visible text: classifiers label the visible turn only. A
        continuation's raw text is read from where the user turn it opened starts."""
        raw = self.raw_user_turn if self.thinking is None else self.user_turn
        if self.arm != DEFAULT_ARM:  # a continuation's own user turn, not the header before it
            raw = raw[self.boundary or 0:]
        return Case(self.query, self.answer, self.user_turn, raw, assistant_header,
                    self.thinking or "")

    def record(self) -> dict[str, Any]:
        """The turn as one flat row of :data:`COLUMNS`."""
        return {name: getattr(self, name) for name in COLUMNS}

    def conversation(self, system: str | None = None) -> list[dict[str, str]]:
        """The whole conversation the turn was generated in, then the generated turn: the
        run's system prompt (``system``, where the item has none of its own), the item's
        messages up to the query, the assistant answer as shown, and the user turn. One
        meaning in every export (the Inspect log's messages, the dataset's ``messages``)."""
        opening = [{"role": "system", "content": system}] if system and not any(
            m["role"] == "system" for m in self.messages) else []
        return [*opening, *({"role": m["role"], "content": m["content"]} for m in self.messages),
                {"role": "assistant", "content": self.answer},
                {"role": "user", "content": self.user_turn}]

    def source_values(self, source: str) -> tuple[str | None, float | None]:
        """What ``source`` said of the turn: its label (``undecided`` where it abstained,
        ``error`` where its verdict failed) and probability; (None, None) where it did not
        label it."""
        lab = next((lab for lab in self.labels if lab.source == source), None)
        if lab is None:
            return None, None
        return lab.label or (VERDICT_ERROR if lab.error else "undecided"), lab.probability


def is_human(source: str | None) -> bool:
    """Whether a label source is a person (``human:NAME``)."""
    return bool(source) and str(source).startswith(HUMAN_PREFIX)


def human_label(turn: Turn) -> tuple[bool | None, str | None]:
    """The turn's human verdict (follow-up or not) and its source: the first ``human:`` source
    by name that gave a label; ``(None, None)`` when no person labelled it."""
    for stored in sorted(turn.labels, key=lambda s: s.source):
        if is_human(stored.source) and stored.label is not None:
            return is_follow_up(stored.label), stored.source
    return None, None


@dataclass(frozen=True)
class Condition:
    """One cell of a run's design: the turns generated under the same model (and its variants),
    answerer, dataset, perturbation, temperature and probe arm. The one key every statistic
    groups turns by (summary rows, perturbation effects, variant and run comparisons), in one
    order: conditions sort by the probed model's name, then field by field as declared here."""

    model: str
    answerer: str
    dataset: str
    perturbation: str
    temperature: float
    # Last, with the opened arm as its default: a run of one arm keeps the order and the keys of
    # runs before the arms.
    arm: str = DEFAULT_ARM
    # The variants, after the arm and with the defaults of a run without them (the same reason).
    user_variant: str = NATIVE
    enable_thinking: str = DEFAULT_THINKING

    @property
    def probed(self) -> str:
        """The probed model's name as the tables print it (:func:`probed_name`)."""
        return probed_name(self.model, self.user_variant, self.enable_thinking)

    def sort_key(self) -> tuple[Any, ...]:
        # By the printed name first: a variant's rows follow its model's, as when it was a model.
        return (self.probed, self.answerer, self.dataset, self.perturbation, self.temperature,
                self.arm, self.model, self.user_variant, self.enable_thinking)

    def __lt__(self, other: Condition) -> bool:
        return self.sort_key() < other.sort_key()

    @classmethod
    def of(cls, turn: Turn) -> Condition:
        return cls(turn.model, turn.answerer, turn.dataset, turn.perturbation, turn.temperature,
                   turn.arm, turn.user_variant, turn.enable_thinking)


@dataclass(frozen=True)
class Answer:
    """One assistant answer of a run (the turn the probe's user turns follow) with its score."""

    model: str
    dataset: str
    item_id: str
    key: str
    text: str
    thinking: str | None
    error: str | None
    finish_reason: str
    correct: bool | None
    extracted: str | None
    reference: str | None
    scorer: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    """Further metrics of the score, e.g. IFEval's loose and instruction-level accuracy."""
    enable_thinking: str = DEFAULT_THINKING
    """Answers have no user-turn variant: every variant follows its native model's answers."""
