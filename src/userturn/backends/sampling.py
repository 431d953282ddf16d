"""Reproducible sampling for a batch: each row's token depends only on its seed and the step.

A resumed run generates in other batches than an uninterrupted one, so a row's sample must not
depend on its neighbours. Rather than one random generator per row (a loop per step that a GPU
pays for in kernel launches), every row's random number is a counter-based hash of (seed, step)
computed for the whole batch with integer tensor operations on the model's device.
"""

from __future__ import annotations

from typing import Any, Sequence

from userturn.records import GenerationParams


class SeededSampler:
    """Temperature/top-p sampling, reproducible per row, as one batched logits processor.

    Each row draws its token by inverting its distribution's cumulative sum at a uniform number
    ``u`` in [0, 1). ``u`` is a counter-based hash of (the row's seed, the step): no generator
    state, nothing that depends on the batch, the same on every device, and computed for all rows
    with a few integer tensor operations. Inverting the cumulative sum samples exactly from the
    (temperature-scaled, nucleus-filtered) softmax, and a token outside the nucleus has no width
    in it, so it is never drawn. The processor leaves only the drawn token finite, so
    ``generate`` (run greedy) picks exactly it.
    """

    def __init__(self, params: GenerationParams, seeds: Sequence[int], device: str,
                 prompt_width: int) -> None:
        self.temperature, self.top_p = params.temperature, params.top_p
        self.prompt_width = prompt_width  # the step is the number of tokens generated so far
        self.seeds = seed_tensor(seeds, device)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        step = input_ids.shape[1] - self.prompt_width
        picks = seeded_picks(scores, self.seeds, step, self.temperature, self.top_p)
        only = torch.full_like(scores, float("-inf"))
        return only.scatter_(1, picks[:, None], 0.0)


def seeded_picks(scores: Any, seeds: Any, steps: Any, temperature: float, top_p: float) -> Any:
    """The token each row draws from ``scores`` at its step (an int for all rows, or one per row:
    the refill loop's rows are at different steps): what :class:`SeededSampler` leaves finite."""
    import torch

    probs = torch.softmax(scores.float() / temperature, dim=-1)
    if top_p < 1.0:
        probs = nucleus(probs, top_p)
    # Summed in float64: 49,152 float32 terms would drift by more than a rare token's mass.
    cumulative = torch.cumsum(probs.double(), dim=-1)
    total = cumulative[:, -1:]
    uniform = seeded_uniform(seeds, steps)[:, None]
    # Kept below the sum's last value, so the search never runs past the last kept token.
    target = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cumulative, target, right=True)[:, 0]


def seed_tensor(seeds: Sequence[int], device: str) -> Any:
    """Seeds as the int64 tensor :func:`seeded_uniform` hashes."""
    import torch

    return torch.tensor([s & _SEED_MASK for s in seeds], dtype=torch.int64, device=device)


_SEED_MASK = (1 << 63) - 1  # seeds are non-negative int64 (the pipeline derives 63-bit ones)
_LOW32 = 0xFFFFFFFF
_MIX = 0x045D9F3B  # an odd multiplier below 2**31: products of 32-bit values stay in int64


def _mix32(x: Any) -> Any:
    """A bijection of 32-bit values held in int64 (xor-shift, multiply, xor-shift, multiply,
    xor-shift) that spreads every input bit over the output: consecutive counters give
    unrelated outputs. Only shifts, xors and products that fit in int64, so it is exact and
    identical on every device."""
    x = x ^ (x >> 16)
    x = (x * _MIX) & _LOW32
    x = x ^ (x >> 16)
    x = (x * _MIX) & _LOW32
    return x ^ (x >> 16)


def seeded_uniform(seeds: Any, step: Any) -> Any:
    """One uniform number in [0, 1) per seed for this step (an int, or an int64 tensor of one step
    per seed), as float64 with 53 random bits: a hash of (seed, step) that depends on nothing
    else."""
    state = _mix32((seeds & _LOW32) ^ 0x9E3779B9)
    state = _mix32(state ^ (seeds >> 32))
    state = _mix32(state ^ step)
    high = _mix32(state ^ 0x85EBCA6B)
    low = _mix32(high ^ 0xC2B2AE35) >> 11
    return (high * (1 << 21) + low).double() / float(1 << 53)


def nucleus(probs: Any, top_p: float) -> Any:
    """``probs`` kept on each row's smallest set of most likely tokens whose mass reaches
    ``top_p`` (always at least the top token), renormalised."""
    import torch

    sorted_probs, order = torch.sort(probs, descending=True, dim=-1)
    keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p  # always keeps the top token
    filtered = torch.zeros_like(probs).scatter_(1, order, sorted_probs * keep)
    return filtered / filtered.sum(dim=-1, keepdim=True)
