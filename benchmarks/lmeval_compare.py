"""The assistant pass on GSM-Symbolic items: userturn against lm-evaluation-harness, same model
(SmolLM2, fp32), same backend (HF transformers, model.generate), same batch size, same token
budget, greedy, measured side by side (alternating) in one process.

    .venv-bench/bin/python benchmarks/lmeval_compare.py [--items 24] [--max-tokens 256]
    .venv-bench/bin/python benchmarks/lmeval_compare.py --model tiny --items 2 --max-tokens 4 --repeats 1  # smoke

(.venv-bench: torch==2.13.0 pinned, lm-eval==0.4.13 and userturn; see docs/backends.md.) lm-eval
reads a LOCAL task (a YAML and a JSONL file written to a temporary folder), so it runs offline.
Both sides get an already loaded model: the time is rendering/tokenizing, generation, decoding
and, for userturn, committing each chunk to the run store; for lm-eval, building the task from
the JSONL file and scoring. Prints each side's wall time, their ratio (userturn / lm-eval) and
how many of the answers are identical (a check that both did the same work).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from userturn.backends import load_backend  # noqa: E402
from userturn.chat.render import render_assistant_turn  # noqa: E402
from userturn.data import load_dataset  # noqa: E402
from userturn.probe.generation import generate  # noqa: E402
from userturn.records import GenerationParams, Request  # noqa: E402
from userturn.store.database import RunStore  # noqa: E402

TASK = """task: userturn_gsm_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["<|im_end|>"]
  max_gen_toks: {max_tokens}
  do_sample: false
  temperature: 0.0
metric_list:
  - metric: exact_match
"""


def run_userturn(backend, items, max_tokens: int) -> tuple[float, dict[str, str]]:
    params = GenerationParams(0.0, 1.0, max_tokens)
    with tempfile.TemporaryDirectory() as folder:
        store = RunStore.create(Path(folder))
        start = time.perf_counter()
        requests = []
        for item in items:
            prompt = render_assistant_turn(backend.template, list(item.messages))
            requests.append(Request(prompt.text, params, prompt.stop, 0))
        generations = generate(store, backend, requests, role="assistant")
        elapsed = time.perf_counter() - start
        store.close()
    return elapsed, {item.query: g.text for item, g in zip(items, generations)}


def run_lmeval(lm, task_dir: Path, items: int) -> tuple[float, dict[str, str]]:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    start = time.perf_counter()
    results = simple_evaluate(model=lm, tasks=["userturn_gsm_local"],
                              task_manager=TaskManager(include_path=str(task_dir)),
                              apply_chat_template=True, log_samples=True, limit=items,
                              random_seed=0, numpy_random_seed=0, torch_random_seed=0,
                              fewshot_random_seed=0)
    elapsed = time.perf_counter() - start
    samples = results["samples"]["userturn_gsm_local"]
    return elapsed, {s["doc"]["question"]: s["resps"][0][0].strip() for s in samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="a ChatML model (the task stops at "
                        "<|im_end|>); tiny: a smoke run")
    parser.add_argument("--items", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    from lm_eval.models.huggingface import HFLM

    items = load_dataset("gsm_symbolic", limit=args.items, seed=0).items
    backend = load_backend(args.model, batch_size=args.batch_size, device="cpu")
    lm = HFLM(pretrained=backend.model, tokenizer=backend.tokenizer, batch_size=args.batch_size,
              max_gen_toks=args.max_tokens, device="cpu")
    run_userturn(backend, items[:2], 4)  # warm-up (the model is shared by both sides)
    with tempfile.TemporaryDirectory() as folder:
        task_dir = Path(folder)
        data = task_dir / "items.jsonl"
        data.write_text("".join(json.dumps({"question": i.query, "answer": i.reference}) + "\n"
                                for i in items))
        (task_dir / "task.yaml").write_text(TASK.format(data=data, max_tokens=args.max_tokens))
        ours, theirs = [], []
        for _ in range(args.repeats):  # alternate, so drift in machine load hits both sides
            elapsed, our_texts = run_userturn(backend, items, args.max_tokens)
            ours.append(elapsed)
            elapsed, their_texts = run_lmeval(lm, task_dir, args.items)
            theirs.append(elapsed)
    same = sum(our_texts.get(q) == t for q, t in their_texts.items())
    print(f"{args.model} fp32, HF transformers, {len(items)} gsm_symbolic items, batch "
          f"{args.batch_size}, max {args.max_tokens} new tokens, greedy, {args.repeats} "
          "alternating runs each")
    print(f"userturn {statistics.median(ours):6.1f}s (runs {', '.join(f'{t:.1f}' for t in ours)})"
          f"  lm-eval {statistics.median(theirs):6.1f}s (runs "
          f"{', '.join(f'{t:.1f}' for t in theirs)})  ratio userturn/lm-eval "
          f"{statistics.median(ours) / statistics.median(theirs):.3f}  identical answers "
          f"{same}/{len(their_texts)}")


if __name__ == "__main__":
    main()
