"""The continuation arm's cost beside the opened arm's, on the same items, in one process.

    .venv/bin/python benchmarks/arms_cost.py [--model smollm2] [--items 20] [--samples 4] \\
        [--user-max-tokens 96] [--continuation-max-tokens 128] [--batch-size 8]
    .venv/bin/python benchmarks/arms_cost.py --model tiny --items 2 --samples 1 \\
        --user-max-tokens 4 --continuation-max-tokens 6  # smoke

The same GSM-Symbolic items with their reference solution as the answer, each context greedy and
``--samples`` times at T=1, through userturn's generation stage twice: the opened arm's prompts
(the USER header opened, stopping at the user end-of-turn) and the continuation arm's (the
assistant's turn closed; the model goes on past its end-of-sequence tokens, writes whichever
header it writes, and stops where that turn closes or at its budget). Then the next-role
probabilities of each continuation prompt, one scoring pass each. Prints each side's generated
tokens, seconds and tokens/s, what the continuations opened, and the last line
``continuation / opened time: R`` (the arm's wall time over the opened arm's, generation and
scoring included).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from rows_busy import through_the_stage  # noqa: E402  (the generation stage, timed)

from userturn.backends import load_backend
from userturn.backends.options import engine_end_texts
from userturn.chat.continuation import (
    continuation_markers,
    next_role_options,
    next_role_probabilities,
    parse_continuation,
    render_continuation,
)
from userturn.chat.render import render_user_turn
from userturn.data import load_dataset
from userturn.records import GenerationParams, Request


def contexts(items: int) -> list[list[dict[str, str]]]:
    dataset = load_dataset("gsm_symbolic", limit=items, seed=0)
    return [[*item.messages, {"role": "assistant", "content": str(
        item.metadata.get("solution") or f"The answer is {item.reference}.")}]
        for item in dataset.items]


def requests_of(prompts: list[tuple[str, tuple[str, ...]]], samples: int, max_tokens: int,
                past_end: bool) -> list[Request]:
    out = []
    for index, (text, stop) in enumerate(prompts):
        out.append(Request(text, GenerationParams(0.0, 1.0, max_tokens), stop, 0,
                           past_end=past_end))
        out.extend(Request(text, GenerationParams(1.0, 1.0, max_tokens), stop,
                           1000 * index + s, past_end=past_end) for s in range(samples))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--items", type=int, default=20)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--user-max-tokens", type=int, default=96)
    parser.add_argument("--continuation-max-tokens", type=int, default=128)
    parser.add_argument("--batch-size", default="8")
    args = parser.parse_args(argv)
    size = "auto" if args.batch_size == "auto" else int(args.batch_size)
    backend = load_backend(args.model, batch_size=size)
    conversations = contexts(args.items)
    opened = [render_user_turn(backend.template, m) for m in conversations]
    ends = engine_end_texts(backend)
    continued = [render_continuation(backend.template, m, ends=ends) for m in conversations]
    opened_requests = requests_of([(p.text, p.stop) for p in opened], args.samples,
                                  args.user_max_tokens, past_end=False)
    continued_requests = requests_of([(p.text, p.stop) for p in continued], args.samples,
                                     args.continuation_max_tokens, past_end=True)
    through_the_stage(backend, opened_requests[:2])  # the weights load and warm up outside the timings
    print(f"model {args.model}, {args.items} items x (1 greedy + {args.samples} at T=1), "
          f"opened budget {args.user_max_tokens}, continuation budget "
          f"{args.continuation_max_tokens}, batch size {size}", flush=True)

    opened_s, opened_out = through_the_stage(backend, opened_requests)
    continued_s, continued_out = through_the_stage(backend, continued_requests)
    markers = continuation_markers(backend.template, ends)
    options = next_role_options(markers)
    start = time.perf_counter()
    roles = [next_role_probabilities([role for role, _ in options], backend.score_options(
        p.text, [option for _, option in options], whole=True)) for p in continued]
    scoring_s = time.perf_counter() - start

    for name, seconds, out in (("opened", opened_s, opened_out),
                               ("continuation", continued_s, continued_out)):
        tokens = sum(g.completion_tokens for g in out)
        print(f"{name:13s} {tokens:6d} tokens in {seconds:7.1f} s  {tokens / seconds:7.1f} "
              f"tok/s  ({len(out)} turns)")
    print(f"next-role scoring: {len(continued)} prompts in {scoring_s:.1f} s")
    firsts = Counter(parse_continuation(markers, g.raw_text or g.text).role
                     for g in continued_out)
    mean = {role: sum(r[role] for r in roles) / len(roles) for role in roles[0]}
    print("continuations opened first: " + ", ".join(f"{k} {v}" for k, v in firsts.most_common()))
    print("mean next-role probabilities: " + ", ".join(f"{k} {v:.3f}" for k, v in mean.items()))
    print(f"continuation / opened time: {(continued_s + scoring_s) / opened_s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
