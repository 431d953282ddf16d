"""The labelled corpus of user turns that ships with userturn (docs/corpus.md).

Each row: query, answer, user_turn, the adjudicated ``label``, both annotators' labels, how the
label was reached, the ``split`` (train/dev/test, drawn by query) and the ``source`` (model,
dataset, temperature, perturbation; ``human`` for real next turns; ``authored`` hard cases).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from userturn.labels.context import ContextReading
from userturn.labels.training import Example, read_examples

CORPUS_FILE = Path(__file__).with_name("corpus.jsonl.gz")
# The corpus's turns read in context by the embedded scorer (labels/context.py), so that
# `userturn train-classifier --with-corpus` does not spend an hour re-reading them.
CORPUS_READINGS = Path(__file__).with_name("corpus_readings.npz")


def corpus_examples(split: str | None = None, path: Path = CORPUS_FILE) -> list[Example]:
    """The corpus's labelled turns, all or one split."""
    examples = read_examples(path)
    return [ex for ex in examples if split is None or ex.split == split]


def corpus_readings(path: Path = CORPUS_READINGS) -> tuple[dict[str, ContextReading], str]:
    """The shipped readings of the corpus's turns by turn key, and the scorer that made them
    (nothing where the file is absent: they are then computed)."""
    if not path.is_file():
        return {}, ""
    with np.load(path, allow_pickle=False) as data:
        keys, features, embedding = data["keys"], data["features"], data["embedding"]
        scorer = str(data["scorer"])
    return ({str(key): ContextReading(features[i].astype(np.float32),
                                      embedding[i].astype(np.float32))
             for i, key in enumerate(keys)}, scorer)


def save_corpus_readings(readings: dict[str, ContextReading], scorer: str, path: Path,
                         embedding: int) -> None:
    """Write ``readings`` (their first ``embedding`` hidden dimensions, in float16)."""
    from userturn.store.atomic import write_file

    keys = sorted(readings)

    def write(temporary: Path) -> None:
        with open(temporary, "wb") as handle:
            np.savez_compressed(
                handle, keys=np.array(keys), scorer=np.array(scorer),
                features=np.stack([readings[k].features for k in keys]).astype(np.float32),
                embedding=np.stack([readings[k].embedding[:embedding] for k in keys]
                                   ).astype(np.float16))

    write_file(path, write)
