"""GPU smoke check for the in-process backends, for a CUDA machine without network.

    PYTHONPATH=src python benchmarks/gpu_smoke.py            # exit 0: every check that ran passed

It builds the tiny test model in a temporary folder (no download), then checks on the GPU:
1. the transformers backend on cuda writes the same greedy user turns as on cpu (fp32),
   and seeded samples are reproducible and independent of their batch;
2. where vLLM is importable: ``vllm/FOLDER`` in float32 writes the same greedy user turns as the
   transformers backend, a sample does not depend on the other requests of its chunk, and
   ``tensor_parallel_size``/``data_parallel_size`` pass through (``--tp N`` where N GPUs exist).
Each check prints one line; a check that cannot run (no vLLM) says so and is not counted as run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ANSWERS = ["He has 36.", "The total is 36 pencils.", "It is 42.", "Four apples."]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=1, help="vLLM tensor_parallel_size")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()

    import torch

    from userturn.backends import load_backend
    from userturn.backends.hf import TransformersBackend
    from userturn.backends.models import resolve_model
    from userturn.backends.tiny import build_tiny_model
    from userturn.chat.render import render_user_turn
    from userturn.records import GenerationParams, Request

    if not torch.cuda.is_available():
        print("no CUDA device: nothing checked")
        return 2
    folder = Path(tempfile.mkdtemp(prefix="userturn-gpu-")) / "tiny"
    build_tiny_model(folder)
    ref = resolve_model(str(folder))
    cpu = TransformersBackend(ref, batch_size=4, device="cpu")
    gpu = TransformersBackend(ref, batch_size=4, device="cuda")
    prompts = [render_user_turn(cpu.template, [
        {"role": "user", "content": "Tom has 3 boxes of 12 pencils. How many pencils?"},
        {"role": "assistant", "content": a}]) for a in ANSWERS]
    greedy = [Request(p.text, GenerationParams(0.0, 1.0, args.max_tokens), p.stop, 0)
              for p in prompts]
    hot = [Request(prompts[0].text, GenerationParams(1.0, 1.0, args.max_tokens), prompts[0].stop,
                   seed) for seed in (11, 12, 13, 14, 15)]
    failures = 0

    def check(name: str, ok: bool, detail: str = "") -> None:
        nonlocal failures
        failures += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}")

    reference = [g.text for g in cpu.complete(greedy)]
    on_gpu = [g.text for g in gpu.complete(greedy)]
    check("transformers cuda greedy == cpu greedy (fp32)", on_gpu == reference,
          f"{on_gpu} != {reference}")
    together = [g.text for g in gpu.complete(hot)]
    alone = [gpu.complete([r])[0].text for r in hot]
    check("transformers cuda: seeded samples independent of their batch", together == alone)

    try:
        import vllm  # noqa: F401
    except ImportError:
        print("SKIP vLLM checks: vllm is not importable here")
        return 1 if failures else 0
    start = time.perf_counter()
    served = load_backend(f"vllm/{folder}", backend_args={
        "dtype": "float32", "tensor_parallel_size": args.tp, "max_model_len": 1024,
        "gpu_memory_utilization": 0.3})
    print(f"vLLM engine started in {time.perf_counter() - start:.0f} s")
    served_greedy = [g.text for g in served.complete(greedy)]
    check("vllm float32 greedy == transformers greedy", served_greedy == reference,
          f"{served_greedy} != {reference}")
    together = [g.text for g in served.complete(hot)]
    reordered = [g.text for g in served.complete(hot[::-1])][::-1]
    alone = [served.complete([r])[0].text for r in hot]
    check("vllm: a seeded sample does not depend on its chunk", together == reordered == alone)
    check("vllm: different seeds give different samples", len(set(together)) > 1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
