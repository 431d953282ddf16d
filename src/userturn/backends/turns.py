"""From generated token ids to a Generation, the same way for every in-process backend.

transformers, vLLM and llama.cpp all hand us the token ids they generated; cutting them at the
user turn's end and decoding them here (with the model's Hugging Face tokenizer, or llama.cpp's
own detokenizer) means the same tokens give the same ``text``, ``raw_text`` and finish reason
whichever engine produced them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from userturn.records import Generation

Decode = Callable[[Sequence[int]], str]  # token ids -> text, special tokens kept


def split_stops(stop: Sequence[str], encode: Callable[[str], list[int]],
                eos_ids: Iterable[int | None],
                special: Iterable[str] = ()) -> tuple[list[int], list[str]]:
    """(stop token ids, stop strings): a marker that is one special token (``<|im_end|>``) stops
    on its id (cheap, exact); any other marker is matched in the decoded text, since a plain word
    is often generated as another token (with its leading space) than the one it encodes to alone.
    End-of-sequence ids always stop."""
    ids = {i for i in eos_ids if i is not None}
    specials = set(special)
    strings = []
    for marker in stop:
        tokens = encode(marker)
        if len(tokens) == 1 and marker in specials:
            ids.add(tokens[0])
        else:
            strings.append(marker)
    return sorted(ids), strings


def finish_turn(tokens: Sequence[int], prompt_tokens: int, stop: Sequence[str],
                stop_ids: set[int], decode: Decode, special: Sequence[str],
                pad_id: int | None = None) -> Generation:
    """A Generation from the generated ids: cut after the first stop id, or at the first stop
    string in the text (``raw_text`` keeps the marker, ``text`` drops it, special tokens and
    surrounding whitespace)."""
    tokens = list(tokens)
    end = next((i + 1 for i, t in enumerate(tokens) if t in stop_ids), len(tokens))
    tokens = tokens[:end]
    while tokens and pad_id is not None and tokens[-1] == pad_id and tokens[-1] not in stop_ids:
        tokens.pop()  # padding after a row of a batch stopped on a stop string
    raw = decode(tokens)
    hits = [(raw.find(m), m) for m in stop if m in raw]
    if hits:
        position, marker = min(hits)
        raw, visible, reason = raw[:position + len(marker)], raw[:position], "stop"
    elif tokens and tokens[-1] in stop_ids:
        visible, reason = decode(tokens[:-1]), "stop"
    else:
        visible, reason = raw, "length"
    for token in special:
        visible = visible.replace(token, "")
    return Generation(visible.strip(), raw, reason, prompt_tokens, len(tokens))


def specials_longest_first(tokens: Iterable[str]) -> list[str]:
    return sorted({t for t in tokens if t}, key=len, reverse=True)


def end_texts(eos_ids: Iterable[int | None], text_of: Callable[[int], str]) -> tuple[str, ...]:
    """The text of each end-of-generation id, once each, in order: what a continuation past the
    end reads as an end (Qwen2.5 ends a turn at ``<|im_end|>`` and a generation also at
    ``<|endoftext|>``, its BOS)."""
    return tuple(dict.fromkeys(t for i in eos_ids if i is not None and (t := text_of(i))))


def generation_config_file(folder: str) -> dict[str, Any]:
    """A model folder's generation_config.json (its end-of-sequence ids, suppressed tokens); {}
    where there is none or it cannot be read."""
    file = Path(folder) / "generation_config.json"
    try:
        config = json.loads(file.read_text()) if file.is_file() else {}
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]
