"""Rows refilled as turns finish: the transformers backend's decoding loop.

User turns end at very different lengths, and a static batch (``model.generate`` on left-padded
prompts) keeps every row waiting for its longest. Here a row whose turn ends (a stop marker or its
budget) leaves at once and the next prompt takes its slot, so each step of the model advances
``width`` turns for as long as prompts are waiting.

Why a loop of our own and not transformers' continuous batching (``generate_batch`` and its
manager, transformers 5): that engine runs in a thread over a paged cache with an attention
implementation of its own, so its float results are not those of ``generate``'s padded batches
(greedy turns would drift from the ones stored runs hold); its logits processors see one flat
batch of tokens with per-request tensors for the processors it knows, so our draw (a hash of the
row's seed and step) would have neither; it stops on token ids only, not on stop strings; and it
needs transformers 5 where we accept 4.56.

What keeps the turns those of ``generate``: each row is computed as ``generate`` computes it in a
left-padded batch. The cache is a ``DynamicCache`` whose rows are left-padded to one length, every
row's tokens at its right end, so a row's attention mask and position ids follow from its length
alone (padding masked out, positions counting the row's own tokens, as ``generate`` counts
them). New prompts are prefilled together, left-padded as ``generate`` pads, and their cache rows
joined to the others, the shorter side padded on the left with zeros the mask hides. Tokens are
chosen as ``generate`` chooses them: the logits processors it would apply (the model's
``generation_config``: suppress_tokens, ...), then argmax, or the seeded draw at the row's own step
(``sampling.py``), so a sampled row depends on its seed and step only. Padding and batch
neighbours change float rounding only, as they already did between static batches.

A model whose cache is not made of plain growing layers (sliding windows, linear attention, a
quantized cache) keeps the static batches (:func:`refills`).
"""

from __future__ import annotations

import inspect
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from userturn.backends.sampling import seed_tensor, seeded_picks

Decode = Callable[[Sequence[int]], str]


@dataclass(frozen=True)
class Row:
    """One turn to generate: its prompt's token ids, how it is drawn and how it ends."""

    ids: tuple[int, ...]
    budget: int  # new tokens at most
    temperature: float  # 0: greedy
    top_p: float
    seed: int
    stop_ids: frozenset[int]
    stop_strings: tuple[str, ...] = ()
    window: int = 0  # how many of the turn's last tokens are searched for a stop string (0: all)


class Forward:
    """The model's forward pass as the loop calls it, whatever this transformers names its cache
    argument (``cache`` since 5.x, ``past_key_values`` before)."""

    def __init__(self, model: Any) -> None:
        params = inspect.signature(model.forward).parameters
        self.model = model
        self.cache_key = "cache" if "cache" in params else "past_key_values"
        # Only the last position's logits, as generate asks for them.
        self.extra = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.model.config)
        except TypeError:  # a transformers whose DynamicCache takes no config
            return DynamicCache()

    def __call__(self, ids: Any, mask: Any, positions: Any, cache: Any) -> Any:
        """The next token's logits (float32, one row per input row); ``cache`` grows in place."""
        import torch

        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                         use_cache=True, **{self.cache_key: cache}, **self.extra)
        return out.logits[:, -1].to(copy=True, dtype=torch.float32)


def refills(model: Any) -> bool:
    """Whether ``model``'s cache is plain growing layers the loop can cut and join (one token
    through it tells)."""
    import torch

    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # a transformers before the cache of layers
        return False
    forward = Forward(model)
    cache = forward.new_cache()
    one = torch.zeros((1, 1), dtype=torch.long, device=model.device)
    with torch.inference_mode():
        forward(one, torch.ones_like(one), one, cache)
    layers = list(getattr(cache, "layers", None) or [])
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def generate_rows(model: Any, rows: Sequence[Row], width: int, *, decode: Decode, pad_id: int,
                  processors: Any = None) -> list[list[int]]:
    """Every row's generated token ids (its stop token included), in the order of ``rows``,
    with at most ``width`` rows in flight: a row that ends hands its slot to the next one."""
    import torch

    slots = _Slots(Forward(model), rows, decode, pad_id, processors)
    queue = deque(range(len(rows)))
    with torch.inference_mode():
        while queue or slots.live:
            while queue and len(slots.live) < width:  # a row may end at its first token
                free = min(width - len(slots.live), len(queue))
                slots.admit([queue.popleft() for _ in range(free)])
            if slots.live:
                slots.step()
    return slots.tokens


class _Slots:
    """The rows in flight: one cache whose rows are left-padded to a common length, each row's
    length in it, the token each row feeds next, and every row's generated tokens."""

    def __init__(self, forward: Forward, rows: Sequence[Row], decode: Decode, pad_id: int,
                 processors: Any) -> None:
        self.forward, self.rows, self.decode = forward, rows, decode
        self.pad_id, self.processors = pad_id, processors
        self.device = forward.model.device
        self.seeds = seed_tensor([row.seed for row in rows], str(self.device))
        self.tokens: list[list[int]] = [[] for _ in rows]
        self.live: list[int] = []  # row index per slot
        self.lengths: list[int] = []  # the row's tokens in the cache, per slot
        self.pending: list[int] = []  # the token each slot feeds at the next step
        self.cache: Any = None

    def admit(self, new: list[int]) -> None:
        """Prefill ``new`` rows together (left-padded, as generate pads a batch) and join them."""
        import torch

        prompts = [self.rows[i].ids for i in new]
        width = max(len(ids) for ids in prompts)
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + list(p) for p in prompts],
                           device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                            device=self.device)
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)  # generate's, pads at 0
        cache = self.forward.new_cache()
        logits = self.forward(ids, mask, positions, cache)
        first = len(self.live)
        self._join(cache, new, [len(p) for p in prompts])
        self._advance(logits, list(range(first, len(self.live))))

    def step(self) -> None:
        """One token for every row in flight."""
        import torch

        length = self.cache.get_seq_length()
        lengths = torch.tensor(self.lengths, device=self.device)
        columns = torch.arange(length + 1, device=self.device)
        mask = (columns[None, :] >= (length - lengths)[:, None]).long()
        logits = self.forward(torch.tensor(self.pending, device=self.device)[:, None], mask,
                              lengths[:, None], self.cache)
        self.lengths = [n + 1 for n in self.lengths]
        self._advance(logits, list(range(len(self.live))))

    def _join(self, cache: Any, new: list[int], lengths: list[int]) -> None:
        if self.cache is None:
            self.cache = cache
        else:
            import torch

            size = max(self.cache.get_seq_length(), cache.get_seq_length())
            for mine, theirs in zip(self.cache.layers, cache.layers):
                mine.keys = torch.cat([_left_pad(mine.keys, size), _left_pad(theirs.keys, size)])
                mine.values = torch.cat([_left_pad(mine.values, size),
                                         _left_pad(theirs.values, size)])
        self.live += new
        self.lengths += lengths
        self.pending += [self.pad_id] * len(new)

    def _advance(self, logits: Any, slots: list[int]) -> None:
        """Choose the next token of ``slots`` (their rows of ``logits``), then let the rows
        whose turn it ends leave."""
        picks = self._choose(logits, slots)
        ended = set()
        for slot, token in zip(slots, picks):
            row_index = self.live[slot]
            row, turn = self.rows[row_index], self.tokens[row_index]
            turn.append(token)
            self.pending[slot] = token
            if token in row.stop_ids or len(turn) >= row.budget or self._says_stop(row, turn):
                ended.add(slot)
        if ended:
            self._drop(ended)

    def _choose(self, logits: Any, slots: list[int]) -> list[int]:
        """What generate picks: its logits processors, then argmax (greedy) or the row's seeded
        draw at its own step (the tokens it has generated so far)."""
        import torch

        rows = [self.live[slot] for slot in slots]
        scores = logits
        if self.processors:
            scores = self.processors(self._sequences(rows), scores)
        picks = scores.argmax(dim=-1)
        kinds: dict[tuple[float, float], list[int]] = {}
        for position, row_index in enumerate(rows):
            row = self.rows[row_index]
            if row.temperature > 0:
                kinds.setdefault((row.temperature, row.top_p), []).append(position)
        for (temperature, top_p), positions in kinds.items():
            at = torch.tensor(positions, device=self.device)
            which = torch.tensor([rows[p] for p in positions], device=self.device)
            steps = torch.tensor([len(self.tokens[rows[p]]) for p in positions],
                                 device=self.device)
            picks[at] = seeded_picks(scores[at], self.seeds[which], steps, temperature, top_p)
        return picks.tolist()

    def _sequences(self, rows: list[int]) -> Any:
        """The rows' prompts and turns so far, left-padded: the ids generate's processors see."""
        import torch

        full = [[*self.rows[i].ids, *self.tokens[i]] for i in rows]
        width = max(len(s) for s in full)
        return torch.tensor([[self.pad_id] * (width - len(s)) + s for s in full],
                            device=self.device)

    def _says_stop(self, row: Row, turn: list[int]) -> bool:
        if not row.stop_strings:
            return False
        tail = self.decode(turn[-row.window:] if row.window else turn)
        return any(marker in tail for marker in row.stop_strings)

    def _drop(self, ended: set[int]) -> None:
        """The ended slots leave; cache columns that only they used are cut off."""
        keep = [slot for slot in range(len(self.live)) if slot not in ended]
        self.live = [self.live[s] for s in keep]
        self.lengths = [self.lengths[s] for s in keep]
        self.pending = [self.pending[s] for s in keep]
        if not keep:
            self.cache = None
            return
        import torch

        index = torch.tensor(keep, device=self.device)
        cut = self.cache.get_seq_length() - max(self.lengths)
        for layer in self.cache.layers:
            layer.keys = layer.keys[index, :, cut:]
            layer.values = layer.values[index, :, cut:]


def _left_pad(states: Any, size: int) -> Any:
    """Cache states ``[rows, heads, length, dim]`` padded with zeros on the left to ``size``."""
    import torch

    missing = size - states.shape[-2]
    return states if missing == 0 else torch.nn.functional.pad(states, (0, 0, missing, 0))


def row_rates(model: Any, widths: Sequence[int], length: int, steps: int = 3) -> dict[int, float]:
    """Row-tokens per second of one step at each width, every row with ``length`` tokens in the
    cache (zeros: a step's time does not depend on what the cache holds). Each width's best of
    ``steps`` steps after an untimed one, so a busy moment of shared cores counts less."""
    import time

    import torch

    forward = Forward(model)
    rates: dict[int, float] = {}
    with torch.inference_mode():
        for width in widths:
            cache = forward.new_cache()
            ids = torch.zeros((width, 1), dtype=torch.long, device=model.device)
            forward(ids, torch.ones_like(ids), ids, cache)  # gives the layers their shapes
            for layer in cache.layers:
                layer.keys = layer.keys.new_zeros((*layer.keys.shape[:2], length,
                                                   layer.keys.shape[-1]))
                layer.values = layer.values.new_zeros((*layer.values.shape[:2], length,
                                                       layer.values.shape[-1]))
            best = float("inf")
            for step in range(steps + 1):
                mask = torch.ones((width, length + step + 1), dtype=torch.long,
                                  device=model.device)
                start = time.perf_counter()
                forward(ids, mask, torch.full_like(ids, length + step), cache)
                if model.device.type == "cuda":
                    torch.cuda.synchronize()
                if step:
                    best = min(best, time.perf_counter() - start)
            rates[width] = width / best
    return rates
