"""Harness overhead: the same user-turn prompts through userturn and through a bare
``model.generate`` loop, same model, batch size and token budget, measured side by side.

    .venv/bin/python benchmarks/overhead.py [--model smollm2] [--items 16] [--batch-size 8]
    .venv/bin/python benchmarks/overhead.py --model tiny --items 2 --max-tokens 4 --repeats 1  # smoke

Prints the wall time of each side and their ratio (userturn / bare; target <= 1.02 on the CPU,
<= 1.05 on a GPU). userturn's side is the real generation stage: chunking, rendering-aware
tokenization, per-row seeded sampling (one batched draw per step), stop handling, decoding and
committing every chunk to the run store (``userturn.probe.generation.generate``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from userturn.backends import load_backend
from userturn.chat.render import prompt_token_ids, render_user_turn
from userturn.data import load_dataset
from userturn.probe.generation import generate
from userturn.records import GenerationParams, Request
from userturn.store.database import RunStore


def probe_prompts(backend, items: int) -> list[str]:
    dataset = load_dataset("gsm_symbolic", limit=items, seed=0)
    prompts = []
    for item in dataset.items:
        answer = item.metadata.get("solution") or f"The answer is {item.reference}."
        messages = [*item.messages, {"role": "assistant", "content": answer}]
        prompts.append(render_user_turn(backend.template, messages).text)
    # Both sides see the prompts in the order userturn batches them (longest first).
    return sorted(prompts, key=len, reverse=True)


def time_userturn(backend, prompts: list[str], params: GenerationParams) -> float:
    stop = render_stop(backend)
    requests = [Request(p, params, stop, seed=1000 + i) for i, p in enumerate(prompts)]
    with tempfile.TemporaryDirectory() as folder:
        store = RunStore.create(Path(folder))
        start = time.perf_counter()
        generate(store, backend, requests, role="user")
        elapsed = time.perf_counter() - start
        store.close()
    return elapsed


def render_stop(backend) -> tuple[str, ...]:
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    return render_user_turn(backend.template, messages).stop


def time_bare(backend, prompts: list[str], params: GenerationParams, batch_size: int) -> float:
    """What a researcher would write by hand: pad, generate, decode."""
    return time_and_count_bare(backend, prompts, params, batch_size)[0]


def time_and_count_bare(backend, prompts: list[str], params: GenerationParams,
                        batch_size: int) -> tuple[float, int]:
    """time_bare, and the tokens generated up to each row's end of turn (counted untimed)."""
    tokenizer, model = backend.tokenizer, backend.model
    eos = tokenizer.convert_tokens_to_ids(render_stop(backend)[0])
    generated, untimed = 0, 0.0
    start = time.perf_counter()
    for offset in range(0, len(prompts), batch_size):
        encoded = [prompt_token_ids(tokenizer, p) for p in prompts[offset:offset + batch_size]]
        # On the model's device, as a researcher's loop would put it (CPU ids slow a GPU down).
        batch = tokenizer.pad({"input_ids": encoded}, return_tensors="pt").to(model.device)
        sampling = {} if params.greedy else {"do_sample": True, "temperature": params.temperature,
                                             "top_p": params.top_p, "top_k": None}
        with torch.inference_mode():
            output = model.generate(**batch, max_new_tokens=params.max_tokens, eos_token_id=eos,
                                    pad_token_id=tokenizer.pad_token_id, **sampling)
        tokenizer.batch_decode(output[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
        counted = time.perf_counter()
        for row in output[:, batch["input_ids"].shape[1]:].tolist():
            generated += next((i + 1 for i, t in enumerate(row) if t == eos), len(row))
        untimed += time.perf_counter() - counted
    return time.perf_counter() - start - untimed, generated


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--items", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    backend = load_backend(args.model, batch_size=args.batch_size)
    prompts = probe_prompts(backend, args.items)
    print(f"model {args.model}, {len(prompts)} user-turn prompts, batch {args.batch_size}, "
          f"{args.max_tokens} new tokens, {torch.get_num_threads()} threads, "
          f"best of {args.repeats} alternating runs")
    for label, params in (("greedy", GenerationParams(0.0, 1.0, args.max_tokens)),
                          ("T=1.0", GenerationParams(1.0, 1.0, args.max_tokens))):
        time_bare(backend, prompts[: args.batch_size], params, args.batch_size)  # warm-up
        ours, bare = [], []
        for _ in range(args.repeats):  # alternate, so drift in machine load hits both sides
            ours.append(time_userturn(backend, prompts, params))
            bare.append(time_bare(backend, prompts, params, args.batch_size))
        print(f"{label:7s} userturn {min(ours):6.2f}s  bare generate {min(bare):6.2f}s  "
              f"ratio {min(ours) / min(bare):.3f} (median ratio "
              f"{statistics.median(ours) / statistics.median(bare):.3f})")


if __name__ == "__main__":
    main()
