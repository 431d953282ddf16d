"""Batched reproducible sampling: the draws follow the model's distribution (temperature and
nucleus included), a row's draw depends only on its seed and step, and a hash of them is what
makes it so. The transformers backend's own tests (test_transformers_backend.py) check the same
property end to end: a request samples the same text alone, in a batch and again."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chi2, chisquare

from userturn.backends.sampling import SeededSampler, nucleus, seeded_uniform
from userturn.records import GenerationParams

# A fixed distribution over 8 tokens, with a rare token (about 1%) so the tail is tested too.
LOGITS = torch.log(torch.tensor([0.30, 0.20, 0.15, 0.12, 0.10, 0.07, 0.05, 0.01]))
DRAWS = 20_000
PROMPT_WIDTH = 5


def draw(params: GenerationParams, seeds: list[int], steps: int, logits: torch.Tensor = LOGITS
         ) -> np.ndarray:
    """The tokens the sampler picks for each seed (rows) at each step (columns)."""
    sampler = SeededSampler(params, seeds, "cpu", prompt_width=PROMPT_WIDTH)
    scores = logits.repeat(len(seeds), 1)
    picks = []
    for step in range(steps):
        input_ids = torch.zeros(len(seeds), PROMPT_WIDTH + step, dtype=torch.long)
        out = sampler(input_ids, scores.clone())
        assert bool((torch.isfinite(out).sum(dim=1) == 1).all())  # exactly one token left
        picks.append(out.argmax(dim=1).numpy())
    return np.stack(picks, axis=1)


def softmax(logits: torch.Tensor) -> np.ndarray:
    return torch.softmax(logits.double(), dim=0).numpy()


def counts(tokens: np.ndarray, size: int) -> np.ndarray:
    return np.bincount(tokens.ravel(), minlength=size)


def test_draws_over_seeds_follow_the_softmax_as_multinomial_does() -> None:
    params = GenerationParams(temperature=1.0, top_p=1.0, max_tokens=1)
    expected = softmax(LOGITS) * DRAWS
    ours = counts(draw(params, list(range(DRAWS)), 1), len(LOGITS))
    reference = torch.multinomial(torch.softmax(LOGITS, dim=0), DRAWS, replacement=True,
                                  generator=torch.Generator().manual_seed(0)).numpy()
    theirs = counts(reference, len(LOGITS))
    ours_p, theirs_p = chisquare(ours, expected).pvalue, chisquare(theirs, expected).pvalue
    # Fixed seeds, so these are fixed numbers (no flake). Ours fits the softmax as multinomial's
    # draws do: a sampler that drew the rare token twice as often would add a chi-square of
    # about 200 (critical value at 0.001: 24), one that matched too well would not be random.
    assert 0.001 < ours_p < 0.999 and 0.001 < theirs_p < 0.999
    critical = chi2.ppf(0.999, df=len(LOGITS) - 1)
    assert chisquare(ours, expected).statistic < critical
    assert chisquare(theirs, expected).statistic < critical


def test_draws_over_steps_of_one_seed_follow_the_softmax() -> None:
    """A row's successive steps are independent draws too (the step is part of the hash)."""
    params = GenerationParams(temperature=1.0, top_p=1.0, max_tokens=1)
    tokens = draw(params, [1234567890123], 5000)
    expected = softmax(LOGITS) * tokens.size
    assert 0.001 < chisquare(counts(tokens, len(LOGITS)), expected).pvalue < 0.999


def test_temperature_scales_the_logits_before_the_draw() -> None:
    params = GenerationParams(temperature=0.5, top_p=1.0, max_tokens=1)
    expected = softmax(LOGITS / 0.5) * DRAWS
    ours = counts(draw(params, list(range(DRAWS)), 1), len(LOGITS))
    assert 0.001 < chisquare(ours, expected).pvalue < 0.999
    flat = GenerationParams(temperature=1.0, top_p=1.0, max_tokens=1)
    assert chisquare(ours, softmax(LOGITS) * DRAWS).pvalue < 1e-6
    assert ours[0] > counts(draw(flat, list(range(DRAWS)), 1), len(LOGITS))[0]


def test_top_p_never_draws_outside_the_nucleus_and_renormalises_inside() -> None:
    # 0.30 + 0.20 + 0.15 = 0.65 < 0.7: the nucleus at 0.7 is the first four tokens.
    params = GenerationParams(temperature=1.0, top_p=0.7, max_tokens=1)
    ours = counts(draw(params, list(range(DRAWS)), 1), len(LOGITS))
    assert ours[4:].sum() == 0
    kept = softmax(LOGITS)[:4]
    assert 0.001 < chisquare(ours[:4], kept / kept.sum() * DRAWS).pvalue < 0.999
    # The top token alone when it alone reaches top_p.
    assert set(counts(draw(GenerationParams(1.0, 0.2, 1), list(range(500)), 1), 8).nonzero()[0]) \
        == {0}


def test_tokens_with_no_probability_are_never_drawn() -> None:
    # What another processor masked (-inf) has no width in the cumulative sum, even at its ends.
    logits = torch.tensor([float("-inf"), 0.0, float("-inf"), 0.0, float("-inf")])
    params = GenerationParams(temperature=1.0, top_p=1.0, max_tokens=1)
    tokens = counts(draw(params, list(range(4000)), 3, logits), 5)
    assert tokens[[0, 2, 4]].sum() == 0 and min(tokens[1], tokens[3]) > 5500


def test_a_rows_draw_depends_on_its_seed_and_step_only() -> None:
    params = GenerationParams(temperature=1.0, top_p=0.9, max_tokens=1)
    seeds = [11, 12, 13, 2**62 + 5, 0]
    together = draw(params, seeds, 30)
    alone = np.concatenate([draw(params, [seed], 30) for seed in seeds])
    shuffled = draw(params, seeds[::-1], 30)[::-1]
    assert (together == alone).all() and (together == shuffled).all()
    assert len({tuple(row) for row in together}) == len(seeds)  # other seeds, other draws
    # Seeds that differ only in their high 32 bits draw differently too.
    assert (draw(params, [7], 30) != draw(params, [7 + 2**40], 30)).any()


def test_the_uniform_numbers_are_fixed_values_of_seed_and_step() -> None:
    seeds = torch.tensor([0, 1, 2**62 + 3], dtype=torch.int64)
    first = seeded_uniform(seeds, 0)
    assert torch.equal(first, seeded_uniform(seeds.clone(), 0))
    assert not torch.equal(first, seeded_uniform(seeds, 1))
    assert first.dtype == torch.float64 and bool(((first >= 0) & (first < 1)).all())
    many = seeded_uniform(torch.arange(100_000, dtype=torch.int64), 3).numpy()
    # Uniform: ten equal bins hold a tenth each (fixed numbers: no flake), and no repeats.
    assert 0.001 < chisquare(np.histogram(many, bins=10, range=(0, 1))[0]).pvalue < 0.999
    assert len(np.unique(many)) == len(many)


@pytest.mark.parametrize("top_p", [0.5, 0.95])
def test_nucleus_keeps_the_smallest_top_set_reaching_top_p(top_p: float) -> None:
    probs = torch.softmax(LOGITS, dim=0)[None]
    kept = nucleus(probs, top_p)[0]
    order = probs[0].argsort(descending=True)
    mass = probs[0][order].cumsum(0)
    size = int((mass < top_p).sum()) + 1
    assert set(kept.nonzero()[:, 0].tolist()) == set(order[:size].tolist())
    assert float(kept.sum()) == pytest.approx(1.0)
