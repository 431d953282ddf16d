"""The labelled corpus of user turns that ships with userturn (docs/corpus.md).

Each row: query, answer, user_turn, the adjudicated ``label``, both annotators' labels, how the
label was reached, the ``split`` (train/dev/test, drawn by query) and the ``source`` (model,
dataset, temperature, perturbation; ``human`` for real next turns; ``authored`` hard cases).
"""

from __future__ import annotations

from pathlib import Path

from userturn.labels.training import Example, read_examples

CORPUS_FILE = Path(__file__).with_name("corpus.jsonl.gz")


def corpus_examples(split: str | None = None, path: Path = CORPUS_FILE) -> list[Example]:
    """The corpus's labelled turns, all or one split."""
    examples = read_examples(path)
    return [ex for ex in examples if split is None or ex.split == split]
