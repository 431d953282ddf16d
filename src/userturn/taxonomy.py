"""The label taxonomy: every label a generated user turn can get, one row each, in order.

This table is the one place a label is defined. Everything that names the labels derives from it:
the label tuple (``records.LABELS``) and which labels count as a follow-up (``Turn.follow_up`` and
every follow-up rate), the judge's rubric (``labels.judge``: definitions, worked examples, the
answer format), the annotation page's buttons and keys (``labels.annotate``), the report's short
headers and colours (``report.numbers``, ``report.plots``) and the RL reward's classes
(``train.rewards``). docs/labels.md's table and the README's list are checked against it by
``tests/test_taxonomy.py``. CONTRIBUTING.md, "How to add a label", walks through adding a row.

The wordings differ on purpose, one per reader: ``meaning`` is the specification people label
from, ``rubric`` the judge's line (its text is rubric ``RUBRIC_VERSION``: stored verdicts are keyed
on it, so a changed word is a new rubric version), ``guide`` one line beside an annotation button.

This module imports nothing of userturn: it sits below ``records`` on the floors so that every
package can read the table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

# What a turn's label column shows where no label decided; no label may take these names.
# No source decided; the generation failed; a continuation opened no user turn (another role
# spoke, or nobody: nothing to label, and no follow-up).
STATUSES = ("undecided", "failed", "no user turn")
VERDICT_ERROR = "error"  # what one source said of a turn where its verdict failed
# The penalties of ``userturn train rl`` (--restatement-penalty, --drift-penalty) a label can pay.
Penalty = Literal["restatement", "drift"]
# The annotation page labels by one key press each, 1 to 9.
MAX_LABELS = 9
_NAME = re.compile(r"[a-z][a-z0-9_]*")
_COLOUR = re.compile(r"#[0-9a-f]{6}")


@dataclass(frozen=True)
class WorkedExample:
    """The judge's worked example of a label: a case and why it gets the label."""

    query: str
    answer: str
    user_turn: str
    rationale: str


@dataclass(frozen=True)
class LabelKind:
    """One label: its name, its three wordings, the judge's example and how reports show it."""

    name: str
    """The stored label, a snake_case word (the judge answers it, a person clicks it)."""
    meaning: str
    """The specification (docs/labels.md's "meaning" cell)."""
    examples: str
    """Schematic examples (docs/labels.md's "examples" cell)."""
    rubric: str
    """The judge's definition: one line of rubric ``RUBRIC_VERSION``, after ``- NAME: ``."""
    guide: str
    """One line for annotators, shown on the label's button."""
    example: WorkedExample
    header: str
    """The short column name in narrow tables (terminal and HTML)."""
    colour: str
    """``#rrggbb``, the label's colour in every plot and badge."""
    follow_up: bool = False
    """Whether a turn with this label counts as a genuine follow-up in every follow-up rate."""
    penalty: Penalty | None = None
    """The RL penalty a user turn with this label pays (None: no penalty)."""


@dataclass(frozen=True)
class Taxonomy:
    """The rows in order (the order of every table, legend and button), checked when built."""

    kinds: tuple[LabelKind, ...]

    def __post_init__(self) -> None:
        problem = _problem(self.kinds)
        if problem:
            raise ValueError(f"label taxonomy: {problem}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(kind.name for kind in self.kinds)

    @property
    def follow_up_labels(self) -> frozenset[str]:
        return frozenset(kind.name for kind in self.kinds if kind.follow_up)

    @property
    def headers(self) -> dict[str, str]:
        return {kind.name: kind.header for kind in self.kinds}

    @property
    def colours(self) -> dict[str, str]:
        return {kind.name: kind.colour for kind in self.kinds}


def _problem(kinds: tuple[LabelKind, ...]) -> str:
    """What is wrong with the rows, or ""."""
    if not 0 < len(kinds) <= MAX_LABELS:
        return f"{len(kinds)} labels; between 1 and {MAX_LABELS} (one annotation key each)"
    for field, values in (("name", [k.name for k in kinds]), ("header", [k.header for k in kinds]),
                          ("colour", [k.colour for k in kinds])):
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            return f"{field} {repeated[0]!r} is given to more than one label"
    for kind in kinds:
        if not _NAME.fullmatch(kind.name) or kind.name in (*STATUSES, VERDICT_ERROR):
            return (f"label name {kind.name!r}: a snake_case word other than "
                    f"{', '.join((*STATUSES, VERDICT_ERROR))}")
        if not _COLOUR.fullmatch(kind.colour):
            return f"{kind.name}: colour {kind.colour!r} is not #rrggbb (lower-case hex)"
        empty = [name for name in ("meaning", "examples", "rubric", "guide", "header")
                 if not getattr(kind, name).strip()]
        if empty:
            return f"{kind.name}: {empty[0]} is empty"
        if kind.follow_up and kind.penalty is not None:
            return f"{kind.name}: a follow-up cannot also pay a penalty"
    if not any(kind.follow_up for kind in kinds):
        return "no label counts as a follow-up: the follow-up rate would always be 0"
    return ""


# Tom's pencils: the worked example of follow_up and generic (the same case, two user turns).
_PENCILS = ("Tom has 3 boxes of 12 pencils and gives away 10. How many are left?",
            "3 x 12 = 36 pencils; 36 - 10 = 26. Tom has 26 pencils left.")

TAXONOMY = Taxonomy((
    LabelKind(
        name="follow_up",
        meaning="A genuine follow-up written as the user, grounded in the SPECIFIC content of the "
                "assistant's answer: asks about a step, number or claim in it, disputes or "
                "corrects it, asks to extend or apply it, points out it was cut off or wrong, or "
                "answers a question the assistant asked. It must refer to something that is in "
                "the answer (not merely the topic of the query).",
        examples='"Why did you multiply by 3 in the second step?"; "Your total is 72 but I think '
                 'it should be 84."; "It stopped mid-sentence, can you finish?"; "Yes, please '
                 'show the recursive version."',
        rubric="a genuine follow-up written as the user, grounded in the SPECIFIC content of the "
               "assistant's answer: asks about a step, number or claim in it, disputes or "
               "corrects it, asks to extend or apply it, points out it was cut off or wrong, or "
               "answers a question the assistant asked. It must refer to something that is in "
               "the answer, not merely the topic of the query.",
        guide="Written as the user and grounded in the SPECIFIC content of the answer: asks about "
              "a step, number or claim in it, disputes or corrects it, asks to extend it, says it "
              "was cut off, or answers the assistant's question.",
        example=WorkedExample(*_PENCILS, "Why did you multiply 3 by 12 first?",
                              "Asks about a specific step of the answer."),
        header="follow-up", colour="#0072b2", follow_up=True),
    LabelKind(
        name="generic",
        meaning="Written as the user and reacting to having received an answer, but not grounded "
                "in its content: could follow almost any answer.",
        examples='"Thanks!"; "Great, thank you for the help."; "Can you explain more?"; "Ok."',
        rubric="written as the user and reacting to having received an answer, but not grounded "
               "in its content: it could follow almost any answer (\"Thanks!\", \"Can you "
               "explain more?\", \"Ok.\").",
        guide="Written as the user, reacting to having got an answer, but not grounded in its "
              "content: could follow almost any answer (\"Thanks!\", \"Can you explain more?\").",
        example=WorkedExample(*_PENCILS, "Great, thanks for the help!",
                              "Thanks the assistant without referring to anything in the "
                              "answer."),
        header="generic", colour="#e69f00"),
    LabelKind(
        name="new_query",
        meaning="Written as the user, but a new or independent request that does not react to the "
                "answer (a different problem, an unrelated question, a new task on the same topic "
                "that ignores the answer).",
        examples='"What is the capital of France?"; a new math word problem; "Write a poem about '
                 'the sea."',
        rubric="written as the user, but a new or independent request that does not react to the "
               "answer: a different problem, an unrelated question, or a new task on the same "
               "topic that ignores the answer.",
        guide="Written as the user, but a new or independent request that does not react to the "
              "answer (a different problem, an unrelated question, a new task).",
        example=WorkedExample("What is 15% of 80?", "15% of 80 is 0.15 x 80 = 12.",
                              "Write a short poem about the ocean.",
                              "An unrelated new request that ignores the answer."),
        header="new", colour="#009e73"),
    LabelKind(
        name="restatement",
        meaning="Repeats or paraphrases the ORIGINAL QUERY (fully or mostly), as if asking again.",
        examples="the same word problem again, possibly slightly changed",
        rubric="repeats or paraphrases the ORIGINAL QUERY (fully or mostly), as if asking again, "
               "possibly slightly changed.",
        guide="Repeats or paraphrases the ORIGINAL QUERY (fully or mostly), as if asking again.",
        example=WorkedExample(
            "Mia reads 20 pages a day for 6 days. How many pages does she read?",
            "20 x 6 = 120, so Mia reads 120 pages.",
            "Mia reads 20 pages every day for 6 days. How many pages has she read?",
            "Paraphrases the original query as if asking it again."),
        header="restate", colour="#f0e442", penalty="restatement"),
    LabelKind(
        name="assistant_drift",
        meaning="The model keeps talking as the ASSISTANT: answers or re-solves the problem, "
                "explains, offers help (\"Sure! Here's...\"), continues the assistant's text, or "
                "emits an assistant role header.",
        examples='"Let\'s solve this step by step..."; "I hope this helps! Let me know if..."; a '
                 'second solution',
        rubric="the writer keeps talking as the ASSISTANT: answers or re-solves the problem, "
               "explains, offers help (\"Sure! Here's...\"), continues the assistant's text, or "
               "emits an assistant role header.",
        guide="Keeps talking as the ASSISTANT: answers or re-solves, explains, offers help, "
              "continues the answer, or emits an assistant role header.",
        example=WorkedExample(
            "A train goes 60 km/h for 3 hours. How far does it go?",
            "Distance = speed x time = 60 x 3 = 180 km.",
            "Sure! Let's solve this step by step. The train travels 60 km each hour, so in 3 "
            "hours it covers 180 km. I hope this helps!",
            "Re-solves the problem and offers help in the assistant's voice."),
        header="drift", colour="#d55e00", penalty="drift"),
    LabelKind(
        name="meta",
        meaning="Talks ABOUT the user, the task or the conversation from outside instead of being "
                "the user: describes what the user wants, narrates, reasons about how to respond, "
                "writes instructions or a system-like prompt.",
        examples='"The user is asking for..."; "In this conversation, the assistant..."; "Here is '
                 'a possible user response:"',
        rubric="talks ABOUT the user, the task or the conversation from outside instead of being "
               "the user: describes what the user wants, narrates, reasons about how to respond, "
               "writes instructions or a system-like prompt (\"The user is asking for...\", "
               "\"Here is a possible user response:\").",
        guide="Talks ABOUT the user, task or conversation from outside: describes what the user "
              "wants, narrates, reasons about a response, writes instructions or a system prompt.",
        example=WorkedExample(
            "Sam had $50 and spent $18. How much is left?", "50 - 18 = 32. Sam has $32 left.",
            "The user is likely to ask for a check of the subtraction, so the response should be "
            "a question about it.",
            "Describes the user and how to respond from outside instead of writing as the user."),
        header="meta", colour="#cc79a7"),
    LabelKind(
        name="empty",
        meaning="Nothing meaningful: empty, whitespace, only markup/special tokens, degenerate "
                "repetition, gibberish, or a fragment with no content.",
        examples='"" ; "......"; "the the the the"',
        rubric="nothing meaningful: empty, whitespace, only markup or special tokens, degenerate "
               "repetition, gibberish, or a fragment with no content.",
        guide="Nothing meaningful: empty, whitespace, only markup or special tokens, degenerate "
              "repetition, gibberish or incoherent text.",
        example=WorkedExample("There are 7 rows of 8 chairs. How many chairs?",
                              "7 x 8 = 56 chairs.", "the the the the the the",
                              "Degenerate repetition with no content."),
        header="empty", colour="#56b4e9"),
))
