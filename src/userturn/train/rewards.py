"""Rewards for ``userturn train rl``: TRL reward functions (one float per completion).

``probe`` is the user-side reward. The completion IS a user turn, written after an open user
header; the offline cascade's verdict on it (the rules where they decide, the learned
classifier elsewhere) is the reward: +1 for a label that counts as a follow-up, minus a penalty
for a label the taxonomy gives one (``restatement``: the restatement penalty, ``assistant_drift``:
the drift penalty; the degenerate modes a user turn can be pushed into by a reward that only likes
questions), 0 otherwise, minus a length penalty past a free budget so that the reward cannot be
farmed with rambling.

``collab`` is the assistant-side reward in the spirit of CollabLLM's multiturn-aware reward. The
completion is an answer; its reward is task correctness, plus ``follow_weight`` x the follow-up
rate of user turns that a frozen copy of the base model samples after it (forward-simulated next
turns), minus ``token_weight`` x the answer's tokens.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping, Sequence

from userturn.backends import Backend
from userturn.backends.turns import finish_turn, specials_longest_first, split_stops
from userturn.chat.render import render_user_turn
from userturn.data import Scorer
from userturn.labels.sources import labeller_named
from userturn.records import Case, GenerationParams, Item, Request, is_follow_up
from userturn.taxonomy import TAXONOMY


class ProbeReward:
    """The classifier's verdict on the model's own user turn (see the module docstring)."""

    __name__ = "probe"

    def __init__(self, tokenizer: Any, stops: Sequence[str], assistant_header: str = "", *,
                 classifier: Any = None, restatement_penalty: float = 1.0,
                 drift_penalty: float = 1.0, length_penalty: float = 0.01,
                 free_tokens: int = 64) -> None:
        self.tokenizer, self.stops, self.assistant_header = tokenizer, tuple(stops), assistant_header
        # The completion is cut into a turn exactly as the probe cuts a generated user turn.
        self._specials = specials_longest_first(getattr(tokenizer, "all_special_tokens", []))
        self._stop_ids, _ = split_stops(
            self.stops, lambda m: tokenizer(m, add_special_tokens=False)["input_ids"],
            [tokenizer.eos_token_id], self._specials)
        self.classifier = classifier or labeller_named("cascade").case_labeller()
        self.restatement_penalty, self.drift_penalty = restatement_penalty, drift_penalty
        # The reward of each label (the classes): the taxonomy's follow-ups and penalties.
        penalty = {"restatement": restatement_penalty, "drift": drift_penalty}
        self.rewards = {kind.name: 1.0 if kind.follow_up else
                        -penalty[kind.penalty] if kind.penalty else 0.0
                        for kind in TAXONOMY.kinds}
        self.length_penalty, self.free_tokens = length_penalty, free_tokens

    def score(self, query: str, answer: str, text: str, raw_turn: str,
              tokens: int) -> tuple[float, str | None]:
        label = self.classifier.classify(
            Case(query, answer, text, raw_turn, self.assistant_header)).label
        reward = self.rewards.get(label or "", 0.0)
        reward -= self.length_penalty * max(0, tokens - self.free_tokens)
        return reward, label

    def __call__(self, prompts: Sequence[str], completions: Sequence[str],
                 completion_ids: Sequence[Sequence[int]], query: Sequence[str],
                 answer: Sequence[str], **_: Any) -> list[float]:
        turns = [finish_turn(ids, 0, self.stops, set(self._stop_ids), self._decode,
                             self._specials) for ids in completion_ids]
        return [self.score(q, a, turn.text, turn.raw_text, len(ids))[0]
                for q, a, turn, ids in zip(query, answer, turns, completion_ids)]

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)


class CollabReward:
    """Correctness + follow-up rate of simulated next user turns - answer length."""

    __name__ = "collab"

    def __init__(self, items: Mapping[str, Item], scorer: Scorer | None, user_model: Backend,
                 *, classifier: Any = None, follow_weight: float = 0.5,
                 token_weight: float = 0.001, samples: int = 2, temperature: float = 1.0,
                 user_max_tokens: int = 64, seed: int = 0) -> None:
        self.items, self.scorer, self.user_model = items, scorer, user_model
        self.classifier = classifier or labeller_named("cascade").case_labeller()
        self.follow_weight, self.token_weight = follow_weight, token_weight
        self.samples, self.seed = samples, seed
        self.params = GenerationParams(temperature, 1.0, user_max_tokens)

    def correctness(self, item: Item, answer: str) -> float:
        if self.scorer is None:
            return 0.0
        return float(self.scorer.score(item, answer).correct)

    def follow_up_rate(self, item: Item, answer: str) -> float:
        """Sample user turns from the frozen model after ``answer``; the share of follow-ups."""
        messages = [*item.messages, {"role": "assistant", "content": answer}]
        prompt = render_user_turn(self.user_model.template, messages)
        requests = [Request(prompt.text, self.params, prompt.stop, self._seed(item.id, answer, k))
                    for k in range(self.samples)]
        turns = [g for g in self.user_model.complete(requests) if g.error is None]
        if not turns:
            return 0.0
        labels = [self.classifier.classify(Case(item.query, answer, g.text, g.raw_text,
                                                prompt.assistant_header)).label for g in turns]
        return sum(is_follow_up(label) for label in labels) / len(turns)

    def __call__(self, prompts: Sequence[str], completions: Sequence[str],
                 completion_ids: Sequence[Sequence[int]], item_id: Sequence[str],
                 **_: Any) -> list[float]:
        rewards = []
        for text, ids, key in zip(completions, completion_ids, item_id):
            item = self.items[key]
            rewards.append(self.correctness(item, text)
                           + self.follow_weight * self.follow_up_rate(item, text)
                           - self.token_weight * len(ids))
        return rewards

    def _seed(self, item_id: str, answer: str, k: int) -> int:
        digest = hashlib.sha256(f"{self.seed}|{item_id}|{answer}|{k}".encode()).digest()
        return int.from_bytes(digest[:8], "big") >> 1
