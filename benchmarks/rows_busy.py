"""Rows busy: the same user-turn prompts three ways, interleaved in one process, each side's useful
tokens per second.

    .venv/bin/python benchmarks/rows_busy.py [--model smollm2] [--items 20] [--samples 4] \\
        [--batch-size 8|auto] [--max-tokens 96] [--repeats 1]
    .venv/bin/python benchmarks/rows_busy.py --model tiny --items 2 --samples 1 --max-tokens 4 \\
        --repeats 1  # smoke

The prompts are the demo's user-turn stage in shape: GSM-Symbolic items with their reference
solution as the answer, each turn written greedily and ``--samples`` times at T=1 (the demo: 20
items, 4 samples, a 96-token budget), so the turns end at the lengths the model gives them.

- static: the transformers backend's left-padded batches through ``model.generate`` (the engine
  before issue #44), through userturn's generation stage (units of a batch, run store included);
  a batch costs as many steps as its longest turn.
- refilled: the refill engine through the same stage (units of QUEUE_WIDTHS batches): a row
  whose turn ends takes the next prompt. With ``--batch-size auto`` it measures its width (as
  ``userturn run`` does on the CPU) and the other two sides take the width it chose.
- limit: a bare ``model.generate`` with every row kept busy: the same prompts in batches of
  turns of the same length (sorted by the length the refilled side wrote), each batch generating
  exactly its longest turn with no stop (every one of its tokens counted). What the model
  delivers with no row waiting, the same prefills included.

Useful tokens are the turns' own (``completion_tokens``); the figure is useful tokens/s, and the
last line ``useful throughput ratio: R`` is refilled / limit (issue #44: at least 0.8). Each
repeat runs the three sides back to back, alternating their order, so drift in the machine's
load hits every side; medians are printed. The static and refilled turns are compared too: the
refill engine must give the same turns.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).parent))
from overhead import probe_prompts, render_stop  # noqa: E402

from userturn.backends import load_backend  # noqa: E402
from userturn.backends.hf import TransformersBackend  # noqa: E402
from userturn.backends.models import resolve_model  # noqa: E402
from userturn.chat.render import prompt_token_ids  # noqa: E402
from userturn.probe.generation import generate  # noqa: E402
from userturn.records import Generation, GenerationParams, Request  # noqa: E402
from userturn.store.database import RunStore  # noqa: E402


def probe_requests(backend: Any, items: int, samples: int, max_tokens: int) -> list[Request]:
    """Each item's user turn greedily and ``samples`` times at T=1, each sample its own seed."""
    stop = render_stop(backend)
    greedy, hot = GenerationParams(0.0, 1.0, max_tokens), GenerationParams(1.0, 1.0, max_tokens)
    out = []
    for index, prompt in enumerate(probe_prompts(backend, items)):
        out.append(Request(prompt, greedy, stop, 0))
        out.extend(Request(prompt, hot, stop, 1000 * index + s) for s in range(samples))
    return out


def through_the_stage(backend: Any, requests: list[Request]) -> tuple[float, list[Generation]]:
    """Wall time of userturn's generation stage (a fresh run store), and its generations."""
    with tempfile.TemporaryDirectory() as folder:
        store = RunStore.create(Path(folder))
        start = time.perf_counter()
        generations = generate(store, backend, requests, role="user")
        elapsed = time.perf_counter() - start
        store.close()
    return elapsed, generations


def busy_limit(backend: Any, requests: list[Request], lengths: list[int],
               width: int) -> tuple[float, int]:
    """Bare ``generate`` in batches of equal turn lengths, every row generating to its batch's
    longest (no stop): wall time and tokens generated."""
    tokenizer, model = backend.tokenizer, backend.model
    order = sorted(range(len(requests)), key=lambda i: lengths[i], reverse=True)
    tokens, start = 0, time.perf_counter()
    for offset in range(0, len(order), width):
        batch_rows = order[offset:offset + width]
        steps = max(1, max(lengths[i] for i in batch_rows))
        encoded = [prompt_token_ids(tokenizer, requests[i].prompt) for i in batch_rows]
        batch = tokenizer.pad({"input_ids": encoded}, return_tensors="pt").to(model.device)
        with torch.inference_mode():
            model.generate(**batch, min_new_tokens=steps, max_new_tokens=steps, do_sample=False,
                           pad_token_id=tokenizer.pad_token_id)
        tokens += steps * len(batch_rows)
    return time.perf_counter() - start, tokens


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--items", type=int, default=20)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--batch-size", default="8", help="rows at once, or auto")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)

    size = "auto" if args.batch_size == "auto" else int(args.batch_size)
    refilled = load_backend(args.model, batch_size=size)
    assert isinstance(refilled, TransformersBackend), "a transformers model: --model smollm2"
    requests = probe_requests(refilled, args.items, args.samples, args.max_tokens)
    _, first = through_the_stage(refilled, requests[:8])  # warm-up; auto measures its width
    width = refilled.batch_size
    static = TransformersBackend(resolve_model(args.model), batch_size=width, batching="static")
    through_the_stage(static, requests[:width])
    busy_limit(refilled, requests[:8], [g.completion_tokens for g in first], width)
    print(f"model {args.model}, {len(requests)} user turns ({args.items} items x 1 greedy + "
          f"{args.samples} at T=1), {args.max_tokens}-token budget, {width} rows "
          f"(--batch-size {size}), refilled units of {refilled.chunk_size}, "
          f"{torch.get_num_threads()} threads, {args.repeats} interleaved repeat(s)", flush=True)

    times: dict[str, list[float]] = {"static": [], "refilled": [], "limit": []}
    useful: dict[str, int] = {}
    turns: dict[str, list[Generation]] = {}

    def stage(name: str, backend: Any) -> Callable[[], None]:
        def run() -> None:
            elapsed, turns[name] = through_the_stage(backend, requests)
            times[name].append(elapsed)
            useful[name] = sum(g.completion_tokens for g in turns[name])
            print(f"  {name}: {useful[name]} tokens in {elapsed:.1f} s", flush=True)
        return run

    def limit() -> None:
        elapsed, useful["limit"] = busy_limit(
            refilled, requests, [g.completion_tokens for g in turns["refilled"]], width)
        times["limit"].append(elapsed)
        print(f"  limit: {useful['limit']} tokens in {elapsed:.1f} s", flush=True)

    sides = [stage("refilled", refilled), stage("static", static), limit]
    for repeat in range(args.repeats):  # the limit needs the refilled side's turn lengths
        for side in (sides if repeat % 2 == 0 else sides[::-1]):
            side()
    rates = {}
    for name in ("static", "refilled", "limit"):
        seconds = statistics.median(times[name])
        rates[name] = useful[name] / seconds
        print(f"{name:9s} useful {rates[name]:7.1f} tok/s  ({useful[name]} tokens in "
              f"{seconds:.1f} s, median of {len(times[name])})")
    same = sum(a == b for a, b in zip(turns["static"], turns["refilled"]))
    print(f"static and refilled turns identical: {same}/{len(requests)}")
    print(f"refilled / static: {rates['refilled'] / rates['static']:.2f}")
    print(f"useful throughput ratio: {rates['refilled'] / rates['limit']:.3f}")


if __name__ == "__main__":
    main()
