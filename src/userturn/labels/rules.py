"""A deterministic, offline, rule-based classifier of generated user turns.

The rules follow docs/labels.md. They label only the CLEAR cases and return an undecided
``Label`` (``label=None``) for everything else, so that an LLM judge labels those later: a wrong
confident label costs more than an undecided one. Deliberately left undecided: word salad and
fluent gibberish (labels.md calls it ``empty``, but rules cannot tell it from prose), emoji-only
replies, a user opening mixed with an assistant-style continuation that does not dominate,
role-labelled scripts ("User: ..."), short replies that may answer a question the assistant asked,
"what if" variations and partial paraphrases of the query, a task on the query's topic that is
not one question mostly of its own words, questions that share too little with the answer to be
called grounded, questions that go on from the answer ("And how many people live there?": an
elliptical opening, a pronoun or "there" naming nothing first, a name or number only the answer
has), requests to continue an answer that does not look cut off, a bare number, "The
answer is N." with an N other than the assistant's final answer (with that N it restates the
answer: drift; "is not N" disputes it), and a question that degenerates into repetition later. The
pipeline splits a reasoning model's thinking off first (``Case.thinking``): the rules label the
visible text, and a turn that is thinking only is ``empty``. A thinking block left in the text
counts as text: reasoning about how to respond reads as ``meta``. A query's format
instructions ("Give the result as your final answer.") are no task content, and "What is the
answer to the question: X" is read as X. The query repeated word for word is ``restatement``,
however short ("What is 12 * 7?") and whatever its voice.

The assistant role header counts only when the model speaks after it: the pipeline stops on that
header, and for deepseek, glm4 and [INST] templates it is the normal end of a user turn.
Rules run in a fixed order and the first that fires wins (see ``_RULES``). Standard library only.
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Callable, Optional, Tuple

from userturn.labels.lexicon import (
    ANSWER_MARK,
    ANSWER_TALK,
    ASKS,
    ASSISTANT_HEADERS,
    CONNECTIVE,
    CUTOFF,
    DEICTIC,
    DRIFT_ANY,
    DRIFT_OPEN,
    ELLIPSIS,
    EQUATION,
    FORMAT,
    GENERIC_WORDS,
    HAN,
    MEANS,
    META,
    NEW_ASK,
    NEW_STORY,
    QUESTION_OPEN,
    REACTS,
    REF_CUE,
    REPLY_WORDS,
    REQUEST,
    RESULT,
    ROLE_ASSISTANT,
    ROLE_LABEL,
    SHORT_OK,
    SPECIAL_TOKENS,
    STATES_ANSWER,
    STOPWORDS,
    STRONG_REF,
    USER_CUE,
    VARIES,
    WRAPPER,
    StemPool,
    content_stems,
    degenerate,
    last_question,
    names_in,
    ngrams,
    numbers_in,
    points_back,
    sameness,
    sentences_of,
    stem,
    strip_special,
    words_of,
)
from userturn.records import Case, Label

Verdict = Tuple[Optional[str], str]  # (label, or None for undecided; which rule fired)

_MAX_CHARS = 20000


class _View:
    """Everything the rules look at, computed once per case."""

    def __init__(self, case: Case) -> None:
        self.case = case
        text = strip_special(case.user_turn if case.user_turn.strip() else case.raw_user_turn)
        text = text[:_MAX_CHARS]  # a longer turn is judged by its beginning: bounds the work
        unwrapped = WRAPPER.sub("", text, count=1)  # "What is the answer to this puzzle: X" is X
        self.wrapped = unwrapped not in ("", text)
        self.text = unwrapped if self.wrapped else text
        # the task: the query without its format instructions, whose words no turn reacts to
        task = " ".join(s for s in sentences_of(case.query) if not FORMAT.match(s)) or case.query
        self.task, self.words, self.query_words = task, words_of(self.text), words_of(task)
        self.answer_words = words_of(case.answer)
        sentences = sentences_of(self.text)
        self.first = sentences[0][:400] if sentences else ""  # the first sentence
        self.user = content_stems(self.words)  # content stems of the user turn
        self.query = StemPool(content_stems(self.query_words))
        self.answer_only = StemPool(s for s in content_stems(self.answer_words)
                                    if s not in self.query)
        self.numbers = numbers_in(self.text)  # digits only: a user's "one" is mostly a pronoun
        self.query_numbers = numbers_in(task, self.query_words)
        self.answer_numbers = numbers_in(case.answer, self.answer_words)
        results = RESULT.findall(case.answer)  # the last "= N", "answer is N" or "#### N"
        self.final = next(iter(numbers_in(results[-1])), None) if results else None
        answer = case.answer.rstrip()
        self.answer_asks = "?" in answer[-300:]
        self.answer_truncated = answer[-1:].isalpha() or (answer != "" and answer[-1] in ",:;-+=(/")

    @property
    def opens_user(self) -> bool:
        """Does the first sentence read as the user (a question, a user cue, or the query)?"""
        first = content_stems(words_of(self.first))
        query_like = len(first) >= 3 and sum(s in self.query for s in first) >= 0.7 * len(first)
        return "?" in self.first or bool(USER_CUE.search(self.first)) or query_like


# ---- 1. an assistant role header followed by speech: the model took the assistant's turn -------
def _rule_header(v: _View) -> Verdict | None:
    raw = unicodedata.normalize("NFKC", v.case.raw_user_turn or v.case.user_turn)
    for header in [h.strip() for h in (v.case.assistant_header, *ASSISTANT_HEADERS) if h.strip()]:
        at = raw.find(unicodedata.normalize("NFKC", header))
        if at < 0:
            continue
        before, after = strip_special(raw[:at]), strip_special(raw[at + len(header):])
        if after and len(after) >= len(before):  # a header at the very end only stopped the turn
            return "assistant_drift", "the turn opens an assistant role header and speaks after it"
    if ROLE_ASSISTANT.match(v.text):
        return "assistant_drift", "the turn starts with an assistant role marker"
    return None


# ---- 2. empty: nothing, markup, punctuation, a stray fragment, or degenerate repetition ---------
def _rule_empty(v: _View) -> Verdict | None:
    text = v.text
    if not text:
        return "empty", "nothing visible after removing whitespace and special tokens"
    if not any(c.isalnum() for c in text):
        if any(unicodedata.category(c) == "So" for c in text):
            return None, "undecided: only emoji or symbols, which may be an acknowledgement"
        return "empty", "only punctuation or symbols"
    core = text.lower().strip(" .!?,;:'\"")
    if sum(c.isalnum() for c in text) <= 2 and core not in SHORT_OK and not HAN.search(text) \
            and not core.isdigit():  # "72" may echo or answer something: not a stray fragment
        return "empty", "a stray fragment of one or two characters"
    if degenerate(text, v.words) and not v.wrapped:  # "The answer to this problem: 1 + 1 + 1"
        first = words_of(v.first)
        if len(first) >= 3 and len(set(first)) >= 0.8 * len(first) and text.count(v.first) == 1 \
                and (REQUEST.search(v.first) or NEW_ASK.match(v.first)):  # not a story
            return None, "undecided: a coherent question or request that degenerates later"
        return "empty", "degenerate repetition (looping tokens, words, lines or phrases)"
    return None


# ---- 3. the query again, nearly word for word, whatever its length ---------------------------
def _rule_verbatim(v: _View) -> Verdict | None:
    """Before the voice rules, since a repeated query is the user's text even where it reads like
    an assistant's ("To solve for u: ..."), and beside rule 7, which needs three content words
    that a short query ("What is 12 * 7?") lacks."""
    if len(v.words) < 3 or all(w in GENERIC_WORDS for w in v.words):
        return None  # "Thank you!" after "Thank you!" is no problem asked again
    similar = max(sameness(v.text, target) for target in (v.case.query, v.task))
    if similar >= 0.9:  # the query with or without its format instructions
        return "restatement", f"repeats the query word for word ({similar:.0%} the same)"
    return None


# ---- 4. the opening voice: an assistant opening, talk about the user from outside, a script -----
def _rule_opening(v: _View) -> Verdict | None:
    if DRIFT_OPEN.match(v.text) and not ASKS.search(v.first):
        return "assistant_drift", "opens like an assistant reply (offer, solution or closing)"
    if META.search(v.first):
        return "meta", "opens by talking about the user, the assistant or the conversation"
    if ROLE_LABEL.match(v.text):  # "User: ..." makes the turn a script: leave it to the judge
        return None, "undecided: the turn is prefixed with a role or script label"
    return None


# ---- 5. the body: meta narration, or assistant-side text that dominates -------------------------
def _assistant_sentence(sentence: str) -> int:
    """2: clearly assistant-side; 1: weakly (a connective or "The answer is" + number); 0: not."""
    if DRIFT_ANY.search(sentence):
        return 2
    if "?" in sentence or USER_CUE.search(sentence):
        return 0
    if DRIFT_OPEN.match(sentence) or ANSWER_MARK.search(sentence) or EQUATION.search(sentence):
        return 2
    return int(bool(CONNECTIVE.match(sentence) and re.search(r"\d", sentence)))


def _copied(words: list[str], v: _View) -> float:
    """Share of these words' 4-grams that come from the answer but not from the query."""
    grams = ngrams(words, 4)
    copied = ngrams(v.answer_words, 4) - ngrams(v.query_words, 4)
    return len(grams & copied) / len(grams) if grams else 0.0


def _rule_body(v: _View) -> Verdict | None:
    if META.search(v.text) and not v.opens_user:
        return "meta", "talks about the user, the assistant or the conversation from outside"
    sentences = sentences_of(v.text)
    kinds = [(_assistant_sentence(s), len(words_of(s))) for s in sentences]
    side = sum(n for kind, n in kinds if kind) if any(k == 2 for k, _ in kinds) else 0
    share = side / max(1, len(v.words))
    # a text ending in a question poses a problem rather than solving one
    ends_asking = "?" in sentences[-1] and not DRIFT_ANY.search(v.text)
    if side and not ends_asking and (share > 0.5 or (not v.opens_user and share >= 0.3)):
        return "assistant_drift", "mostly assistant-side text (solving, answer marks or closings)"
    if side:
        return None, "undecided: user-side text mixed with some assistant-style text"
    if len(v.words) >= 12 and _copied(v.words, v) >= 0.5:
        if v.opens_user and _copied(words_of(v.first), v) < 0.5:
            return None, "undecided: quotes much of the answer inside a user-voiced turn"
        return "assistant_drift", "a coherent copy of a large part of the assistant's answer"
    return None


# ---- 6. "The answer is N.": the assistant's final answer stated again, or disputed --------------
def _rule_answer_statement(v: _View) -> Verdict | None:
    found = STATES_ANSWER.match(v.text)
    if not found or v.final is None or numbers_in(found["n"]) != {v.final}:
        return None  # another number: a user's own result or the model solving anew
    if found["neg"]:
        return "follow_up", f"disputes the assistant's final answer {v.final}"
    if v.answer_asks:
        return None, "undecided: states the answer after the assistant asked a question"
    return "assistant_drift", f"states the assistant's final answer {v.final} again, as the answer"


# ---- 7. restatement: mostly the query's words, nothing taken from the answer --------------------
def _rule_restatement(v: _View) -> Verdict | None:
    taken = sum(s in v.answer_only for s in v.user)
    if v.numbers & v.answer_numbers - v.query_numbers or taken > max(1, 0.1 * len(v.user)):
        return None  # takes a result or content from the answer: it reacts to the answer
    if len(v.user) < 3 or not v.query.stems:
        return None
    mine = StemPool(v.user)
    coverage = sum(s in mine for s in v.query.stems) / len(v.query.stems)
    purity = sum(s in v.query for s in v.user) / len(v.user)
    if coverage >= 0.6 and purity >= 0.8:
        return "restatement", f"repeats {coverage:.0%} of the query's content words and adds little"
    question = set(content_stems(words_of(last_question(v.task))))  # the query asked again?
    one_question = len(sentences_of(v.text)) == 1 and re.match(QUESTION_OPEN, v.text, re.I)
    adds = [s for s in v.user if s not in v.query and s not in v.answer_only]  # "in a leap year"
    if one_question and len(question) >= 3 and purity >= 0.8 and not adds:
        coverage = sum(s in mine for s in question) / len(question)
        if coverage >= 0.75:
            return "restatement", f"asks the query's question again ({coverage:.0%} of its words)"
    return None


# ---- 8. generic: only gratitude / acknowledgement words, nothing grounded -----------------------
def _rule_generic(v: _View) -> Verdict | None:
    if not v.words or len(v.words) > 15 or any(w not in GENERIC_WORDS for w in v.words):
        return None
    if v.answer_asks and REPLY_WORDS & set(v.words):
        return None, "undecided: a short reply that may answer the assistant's question"
    return "generic", "only gratitude or acknowledgement, not grounded in the answer"


# ---- 9. follow_up: a user question/dispute grounded in the answer, or asking for a cut-off rest --
def _rule_follow_up(v: _View) -> Verdict | None:
    if len(v.words) > 60 or len(sentences_of(v.text)) > 4:
        return None
    if v.answer_truncated and CUTOFF.search(v.text) and len(v.words) <= 25:
        return "follow_up", "asks for the missing part of an answer that was cut off"
    replying = v.answer_asks and v.words[:1] != [] and v.words[0] in REPLY_WORDS
    strong = replying or bool(STRONG_REF.search(v.text))
    if not REQUEST.search(v.text) or not (strong or REF_CUE.search(v.text)):
        return None
    if MEANS.match(v.text) and (v.numbers & v.answer_numbers
                                or set(v.user) & set(content_stems(v.answer_words))):
        return "follow_up", "asks what the answer means for a number or thing in it"
    if len(v.numbers - v.query_numbers - v.answer_numbers) >= 2 and not strong:
        return None  # brings several numbers of its own: more like a new problem
    numbers = v.numbers & (v.answer_numbers - v.query_numbers)
    strong = strong or any(re.search(rf"\b(?:this|that|your) \$?{re.escape(n)}\b", v.text, re.I)
                           for n in numbers)  # "What does this 180 represent"
    words = sorted({s for s in v.user if s in v.answer_only and len(s) >= 4}
                   - {stem(w) for w in ANSWER_TALK})
    if numbers and (strong or len(v.words) <= 5):
        return "follow_up", f"questions the answer's number(s) {', '.join(sorted(numbers))}"
    if len(words) >= 2 or (words and strong):
        return "follow_up", f"questions the answer's specific content ({', '.join(words)})"
    return None


# ---- 10. new_query: a question or request sharing no content with the query or the answer -------
def _rule_new_query(v: _View) -> Verdict | None:
    opening = " ".join(v.text.split()[:8])
    if v.answer_asks or DEICTIC.search(opening) or REACTS.search(v.text) or len(v.words) > 150:
        return None
    if _goes_on(v):  # plain None: "no rule fired" is the rationale the classifier was fit on
        return None
    if not ("?" in v.text or NEW_ASK.match(v.text) or NEW_STORY.match(v.text)):
        return None
    if _other_language(v):
        return None  # shared words cannot be compared
    user = set(v.user)
    common = sum(s in v.query or s in v.answer_only for s in user)
    fresh = v.numbers - v.query_numbers - v.answer_numbers
    shared = {n for n in v.numbers - fresh if len(n) > 1}  # a shared digit 1-9 tells nothing
    unrelated = common == 0 or (common == 1 and len(user) >= 5)  # one word: a homonym at most
    if len(user) + len(fresh) + v.wrapped >= 2 and unrelated and not shared:
        return "new_query", "a question or request sharing no content words with query or answer"
    asks = "?" in v.text or re.match(QUESTION_OPEN, v.text, re.I)
    if asks and len(fresh) >= 2 and len(shared) <= 1 and len(user) >= 4 and len(v.words) >= 12 \
            and common <= max(1, 0.15 * len(user)):
        return "new_query", "a new word problem with its own numbers and little shared content"
    if asks and _new_on_topic(v, user):
        return "new_query", "a new question on the query's topic that takes nothing from the answer"
    return None


def _goes_on(v: _View) -> bool:
    """Does the turn go on from the answer, so that sharing no words with it says nothing? An
    elliptical opening ("And how many people live there?"), a pronoun or "there" with nothing
    named before it, or a name or a number (not a lone digit) that only the answer has."""
    if ELLIPSIS.match(v.text) or points_back(v.first):
        return True
    names = names_in(v.case.answer)
    return any(s in names and s not in v.query for s in v.user) or any(
        len(n) > 1 for n in v.numbers & (v.answer_numbers - v.query_numbers))


def _other_language(v: _View) -> bool:
    words = [w for w in v.words if not w.isdigit()]  # "100 + 100 = ?" has no language
    stop_share = sum(w in STOPWORDS for w in words) / max(1, len(words))
    query_stop_share = sum(w in STOPWORDS for w in v.query_words) / max(1, len(v.query_words))
    return bool(words) and stop_share < 0.1 and query_stop_share >= 0.2


def _new_on_topic(v: _View, user: set[str]) -> bool:
    """One question, mostly about things of its own, nothing from the answer, no "why", and no
    quantity, number or condition that would make it a variation or extension of the problem."""
    own = [s for s in user if s not in v.query and s not in v.answer_only]
    return len(sentences_of(v.text)) == 1 and len(own) >= max(3, 0.5 * len(user)) \
        and not any(s in v.answer_only for s in user) and not v.numbers \
        and not STRONG_REF.search(v.text) and not VARIES.search(v.text)


def signals_of(case: Case) -> tuple[float, ...]:
    """The measurements the rules decide by, as numbers, for a learned classifier: lengths,
    overlap of the turn with the answer beyond the query and with the query, copied text,
    question form, voice (assistant openings, meta narration, user cues) and repetition."""
    try:
        v = _View(case)
    except Exception:  # the features of a text the rules cannot read: all zero
        return (0.0,) * _N_SIGNALS
    user, n_words = v.user, len(v.words)
    taken = sum(s in v.answer_only for s in user)
    mine = StemPool(user)
    coverage = sum(s in mine for s in v.query.stems) / len(v.query.stems) if v.query.stems else 0.0
    purity = sum(s in v.query for s in user) / len(user) if user else 0.0
    sentences = sentences_of(v.text)
    raw = case.raw_user_turn or case.user_turn
    values = (
        math.log1p(n_words), math.log1p(len(sentences)), float(not v.text),
        taken / len(user) if user else 0.0, float(taken), coverage, purity,
        _copied(v.words, v) if n_words >= 4 else 0.0,
        float(len(v.numbers & (v.answer_numbers - v.query_numbers))),
        float(len(v.numbers - v.query_numbers - v.answer_numbers)),
        float(len(v.numbers & v.query_numbers)),
        float(v.answer_asks), float(v.answer_truncated), float(v.opens_user),
        float("?" in v.text), float("?" in v.first), float(bool(REQUEST.search(v.text))),
        float(bool(STRONG_REF.search(v.text))), float(bool(REF_CUE.search(v.text))),
        float(bool(CUTOFF.search(v.text))), float(bool(META.search(v.first))),
        float(bool(META.search(v.text))), float(bool(DRIFT_OPEN.match(v.text))),
        float(bool(DRIFT_ANY.search(v.text))), float(bool(ANSWER_MARK.search(v.text))),
        float(bool(EQUATION.search(v.text))), float(bool(USER_CUE.search(v.text))),
        float(bool(ROLE_LABEL.match(v.text))), float(bool(ROLE_ASSISTANT.match(v.text))),
        float(bool(NEW_ASK.match(v.text))), float(bool(DEICTIC.search(" ".join(
            v.text.split()[:8])))), float(bool(REACTS.search(v.text))),
        float(degenerate(v.text, v.words)) if v.text else 0.0,
        float(all(w in GENERIC_WORDS for w in v.words)) if v.words else 0.0,
        float(_other_language(v)), float(any(h in raw for h in ASSISTANT_HEADERS)),
        float(bool(SPECIAL_TOKENS.search(raw))),
        sum(not c.isalnum() and not c.isspace() for c in v.text) / max(1, len(v.text)),
        len(set(v.words)) / n_words if n_words else 0.0,
        float(case.answer.strip() == ""), math.log1p(len(case.answer.split())),
    )
    return values


_N_SIGNALS = 41


# The order, and why:
# 1. header: an assistant role header followed by speech is explicit evidence, whatever the text.
# 2. empty: a turn with no content cannot be anything else, and repetition fools later rules.
# 3. the query repeated nearly word for word is restatement, whatever its voice or length.
# 4-5. voice before content: a re-solved problem or a narration about the user also shares words
#    with the query and the answer, so the assistant / outside-narrator voice is decided first
#    (the opening sentence first, as labels.md says the first sentences decide a mixed text).
# 6. "The answer is N." is judged by N: the assistant's final answer restated or disputed.
# 7-10. content, most certain first: restatement (the query's words) before generic (no content)
#    before follow_up (the answer's content) before new_query (no shared content), the least
#    certain of all because "no shared words" can also mean a paraphrase. Then undecided.
_RULES: tuple[Callable[[_View], Optional[Verdict]], ...] = (
    _rule_header, _rule_empty, _rule_verbatim, _rule_opening, _rule_body, _rule_answer_statement,
    _rule_restatement, _rule_generic, _rule_follow_up, _rule_new_query,
)


def thinking_only(source: str) -> Label:
    """A turn with thinking and nothing visible wrote no user turn: ``empty`` (labels.md)."""
    return Label(label="empty", source=source,
                 rationale="thinking only: no visible text after the thinking")


class RulesClassifier:
    """Labels the clear cases of labels.md; leaves the rest undecided for the judge."""

    name = "rules"
    version = "3"  # bump when rules change; stored beside labels

    def classify(self, case: Case) -> Label:
        if case.thinking.strip() and not case.user_turn.strip():
            return thinking_only(self.name)
        try:
            view = _View(case)
            for rule in _RULES:
                verdict = rule(view)
                if verdict is not None:
                    return Label(label=verdict[0], source=self.name,  # type: ignore[arg-type]
                                 rationale=verdict[1])
        except Exception as exc:  # a classifier must never break the pipeline
            return Label(label=None, source=self.name, rationale="undecided: the rules failed",
                         error=f"{type(exc).__name__}: {exc}")
        return Label(label=None, source=self.name, rationale="undecided: no rule fired")
