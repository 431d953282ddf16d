"""How likely each of a few short continuations of a prompt is: the seam a local judge reads.

A judge that runs on the researcher's own machine need not write a verdict and have it parsed: one
forward pass over its prompt gives the probability of every label as the next words. A backend
that can do this has ``score_options(prompt, options) -> list[float]``: the log-probability of
each option (summed over its tokens) as the continuation of the raw ``prompt``.

Consecutive judge prompts share a long beginning (the rubric), so both engines keep the
key-value state of the last prompt and read only what differs: on the CPU the rubric costs once
per process, not once per turn.
"""

from __future__ import annotations

import copy
import inspect
import math
from typing import Any, Protocol, Sequence, runtime_checkable


@runtime_checkable
class OptionScorer(Protocol):
    def score_options(self, prompt: str, options: Sequence[str], *,
                      whole: bool = False) -> list[float]:
        """log P(option | prompt) for each option, in order; raises on failure. Unless
        ``whole``, an option whose first token no other option shares is scored by that token
        alone (what tells the options apart; one pass over the prompt, nothing more)."""
        ...


def needs_rest(encoded: Sequence[Sequence[int]], whole: bool) -> list[int]:
    """Which options are scored beyond their first token: all of them (``whole``), else those
    whose first token another option shares."""
    firsts = [tokens[0] for tokens in encoded]
    return [i for i, tokens in enumerate(encoded)
            if len(tokens) > 1 and (whole or firsts.count(tokens[0]) > 1)]


def scored_tokens(encoded: Sequence[Sequence[int]], whole: bool) -> list[list[int]]:
    """The tokens of each option whose log-probabilities make its score: all of them where
    :func:`needs_rest` says so, else the first. For engines that read the log-probabilities of
    a prompt with the option appended (vLLM, an OpenAI-compatible server)."""
    if any(not tokens for tokens in encoded):
        raise ValueError("an option encodes to no token")
    rest = set(needs_rest(encoded, whole))
    return [list(tokens if i in rest else tokens[:1]) for i, tokens in enumerate(encoded)]


def can_score_prompts(backend: object) -> bool:
    """Whether ``backend`` reads log-probabilities of continuations of a raw prompt
    (``score_options``): transformers, llama.cpp, vLLM and OpenAI-compatible completions servers
    (where the server returns prompt log-probabilities: its first call says so, or fails in one
    line). A backend without it cannot give next-role probabilities."""
    return isinstance(backend, OptionScorer)


def engine_end_texts(backend: object) -> tuple[str, ...]:
    """The texts of every token that ends a generation on ``backend``'s engine (its
    ``end_texts``; none where it does not say): the continuation arm's stops and end options."""
    return tuple(getattr(backend, "end_texts", ()))


OPTION_ROOM = 8  # tokens an option may take after the prompt


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class TransformersOptions:
    """``score_options`` for a transformers causal LM: the prompt in one pass (continuing the
    previous prompt's cache over their common beginning), then every option in one batched pass
    over a copy of that cache."""

    def __init__(self, model: Any, tokenizer: Any, encode_prompt: Any, device: str,
                 check_fits: Any) -> None:
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.encode_prompt = encode_prompt  # the backend's rule: BOS exactly once
        self.check_fits = check_fits  # the prompt's ids -> raises where the context is too short
        # transformers 5 names the key-value cache ``cache``; earlier versions ``past_key_values``.
        self._cache_arg = ("cache" if "cache" in inspect.signature(model.forward).parameters
                           else "past_key_values")
        self._ids: list[int] = []
        self._cache: Any = None
        self._last: Any = None  # logits predicting the token after ``_ids``

    def score_options(self, prompt: str, options: Sequence[str], *,
                      whole: bool = False) -> list[float]:
        import torch

        ids = list(self.encode_prompt(prompt))
        if not ids or not options:
            raise ValueError("score_options needs a prompt and at least one option")
        self.check_fits(ids)
        keep = common_prefix(self._ids, ids)
        if keep == len(ids) == len(self._ids) and self._last is not None:
            cache, last = self._cache, self._last
        else:
            keep = min(keep, len(ids) - 1)  # at least one token is read: its logits are needed
            cache = None
            if keep > 0 and self._cache is not None:
                cache = copy.deepcopy(self._cache)
                if keep < len(self._ids):
                    cache.crop(keep - len(self._ids))  # drop what the new prompt does not share
            with torch.inference_mode():
                out = self.model(torch.tensor([ids[keep:]], device=self.device), use_cache=True,
                                 logits_to_keep=1, **{self._cache_arg: cache})
            cache, last = out[self._cache_arg], out.logits[0, -1].float()
            self._ids, self._cache, self._last = ids, cache, last
        first = torch.log_softmax(last, dim=-1)
        encoded = [self.tokenizer(o, add_special_tokens=False)["input_ids"] for o in options]
        if any(not tokens for tokens in encoded):
            raise ValueError("an option encodes to no token")
        scores = [float(first[tokens[0]]) for tokens in encoded]
        longer = needs_rest(encoded, whole)
        if longer:
            # The options' later tokens, right-padded in one batch: no real token attends to a
            # pad (causal), and the pads' outputs are never read.
            rows = [encoded[i][:-1] for i in longer]
            width = max(map(len, rows))
            batch = torch.tensor([row + [0] * (width - len(row)) for row in rows],
                                 device=self.device)
            shared = copy.deepcopy(cache)
            shared.batch_repeat_interleave(len(rows))
            with torch.inference_mode():
                out = self.model(batch, use_cache=True, **{self._cache_arg: shared})
            logp = torch.log_softmax(out.logits.float(), dim=-1)
            for row, i in enumerate(longer):
                rest = encoded[i][1:]
                scores[i] += float(sum(logp[row, j, t] for j, t in enumerate(rest)))
        return scores


class LlamaCppOptions:
    """``score_options`` for llama-cpp-python: the prompt evaluated after the common beginning
    with what the context already holds, then each option's tokens one at a time (llama.cpp
    keeps the last position's logits only), rewound after each option."""

    def __init__(self, llama: Any, encode_prompt: Any, encode: Any, lib: Any,
                 check_fits: Any) -> None:
        self.llama, self.encode_prompt, self.encode, self.lib = llama, encode_prompt, encode, lib
        self.check_fits = check_fits  # the prompt's ids -> raises where the context is too short

    def _logits(self) -> Any:
        import numpy as np

        n_vocab = self.llama.n_vocab()
        pointer = self.lib.llama_get_logits(self.llama.ctx)
        return np.ctypeslib.as_array(pointer, shape=(n_vocab,)).astype(np.float64)

    def _eval_from(self, tokens: list[int], start: int) -> Any:
        """Evaluate ``tokens`` after the context's first ``start`` tokens; the last logits."""
        self.llama.n_tokens = start
        self.llama.eval(tokens[start:])
        return _log_softmax(self._logits())

    def score_options(self, prompt: str, options: Sequence[str], *,
                      whole: bool = False) -> list[float]:
        ids = list(self.encode_prompt(prompt))
        if not ids or not options:
            raise ValueError("score_options needs a prompt and at least one option")
        self.check_fits(ids)
        held = list(self.llama.input_ids[:self.llama.n_tokens])
        keep = min(common_prefix(held, ids), len(ids) - 1)
        first = self._eval_from(ids, keep)
        encoded = [list(self.encode(option)) for option in options]
        if any(not tokens for tokens in encoded):
            raise ValueError("an option encodes to no token")
        rest = set(needs_rest(encoded, whole))
        scores = []
        for i, tokens in enumerate(encoded):
            total, logp = 0.0, first
            for j, token in enumerate(tokens if i in rest else tokens[:1]):
                total += float(logp[token])
                if i in rest and j + 1 < len(tokens):
                    logp = self._eval_from([*ids, *tokens[:j + 1]], len(ids) + j)
            scores.append(total)
        self.llama.n_tokens = len(ids)  # the prompt stays: the next one may share it
        return scores


def _log_softmax(logits: Any) -> Any:
    import numpy as np

    top = float(np.max(logits))
    return logits - (top + math.log(float(np.sum(np.exp(logits - top)))))
