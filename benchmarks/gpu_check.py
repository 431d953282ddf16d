"""One GPU check for a CUDA machine without network, in under 8 minutes on one H200.

    PYTHONPATH=src python benchmarks/gpu_check.py            # the GPU machine (docs/backends.md)
    PYTHONPATH=src python benchmarks/gpu_check.py --model tiny --items 4 --max-tokens 4 \\
        --batches 2 --turns 4 --train-size tiny --train-steps 2 --repeats 1    # smoke, any machine

It prints one line per figure:
1. greedy identity: the same user-turn prompts, greedy, through the transformers backend on CUDA
   and on the CPU (float32 both): how many user turns are identical;
2. harness overhead: userturn / bare ``model.generate`` (the bare loop with its ids on the
   device) at each ``--batches`` size, greedy and T = 1 (benchmarks/overhead.py, best of
   ``--repeats``, alternating);
3. labelling: turns per second of the context reader (the default classifier's) on the GPU and
   on the CPU over the corpus's turns, and the largest difference between their features;
4. training: tokens per second of a LoRA step (benchmarks/gpu_train.py, in its own process).
Without CUDA the CUDA parts print a SKIP line and the rest runs on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the sibling benchmarks this one runs

import labelling_speed  # noqa: E402
import overhead  # noqa: E402

from userturn.backends import load_backend  # noqa: E402
from userturn.backends.hf import TransformersBackend  # noqa: E402
from userturn.labels.context import ContextScorer  # noqa: E402
from userturn.records import GenerationParams, Request  # noqa: E402


def greedy_identity(model: str, items: int, max_tokens: int) -> None:
    cpu = load_backend(model, batch_size=16, device="cpu")
    gpu = load_backend(model, batch_size=16, device="cuda")
    prompts = overhead.probe_prompts(cpu, items)
    stop = overhead.render_stop(cpu)
    requests = [Request(p, GenerationParams(0.0, 1.0, max_tokens), stop, 0) for p in prompts]
    on_cpu = [g.text for g in cpu.complete(requests)]
    on_gpu = [g.text for g in gpu.complete(requests)]
    same = sum(a == b for a, b in zip(on_cpu, on_gpu))
    print(f"{'PASS' if same == len(requests) else 'FAIL'} greedy user turns cuda == cpu: "
          f"{same}/{len(requests)} identical")


def harness_overhead(backend: TransformersBackend, device: str, items: int, batches: list[int],
                     max_tokens: int, repeats: int) -> None:
    prompts = overhead.probe_prompts(backend, items)
    for batch in batches:
        backend.batch_size = backend.chunk_size = batch
        for label, params in (("greedy", GenerationParams(0.0, 1.0, max_tokens)),
                              ("T=1", GenerationParams(1.0, 1.0, max_tokens))):
            overhead.time_bare(backend, prompts[:batch], params, batch)  # warm-up
            ours, bare = [], []
            for _ in range(repeats):  # both sides end on token ids copied off the device
                ours.append(overhead.time_userturn(backend, prompts, params))
                bare.append(overhead.time_bare(backend, prompts, params, batch))
            print(f"overhead {device} batch {batch:3d} {label:6s} userturn {min(ours):6.2f}s  "
                  f"bare {min(bare):6.2f}s  ratio {min(ours) / min(bare):.3f}")


def labelling(model: str, turns: int, gpu_turns: int, cuda: bool) -> None:
    cpu = ContextScorer(model, device="cpu")
    cases = labelling_speed.corpus_cases(max(turns, gpu_turns if cuda else 0))
    turns, gpu_turns = min(turns, len(cases)), min(gpu_turns, len(cases))
    labelling_speed.time_reading(cpu, cases[:2], cpu.batch_size)  # warm-up
    cpu_seconds, cpu_readings = labelling_speed.time_reading(cpu, cases[:turns], cpu.batch_size)
    print(f"labelling cpu  {turns / cpu_seconds:8.2f} turns/s  (batch {cpu.batch_size}, "
          f"{torch.get_num_threads()} threads)")
    if not cuda:
        print("SKIP labelling on cuda: no CUDA device")
        return
    gpu = ContextScorer(model, device="cuda")
    labelling_speed.time_reading(gpu, cases[:2], gpu.batch_size)  # warm-up
    gpu_seconds, gpu_readings = labelling_speed.time_reading(gpu, cases[:gpu_turns],
                                                             gpu.batch_size)
    difference = labelling_speed.largest_difference(cpu_readings, gpu_readings[:turns])
    print(f"labelling cuda {gpu_turns / gpu_seconds:8.2f} turns/s  (batch {gpu.batch_size}); "
          f"largest feature difference cuda vs cpu {difference:.1e}")


def training(size: str, steps: int, cuda: bool) -> None:
    device = "cuda" if cuda else "cpu"
    args = ["--size", size, "--device", device, "--steps", str(steps)]
    if not cuda:
        print("SKIP training on cuda: no CUDA device (a tiny smoke step on the CPU instead)")
        args = ["--size", "tiny", "--device", "cpu", "--steps", "2", "--batch-size", "2",
                "--seq-len", "64", "--new-tokens", "4"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, str(HERE / "gpu_train.py"), *args], env=env,
                            capture_output=True, text=True, timeout=600)
    summary = next((json.loads(line) for line in result.stdout.splitlines()
                    if line.startswith("{")), None)
    if result.returncode != 0 or summary is None:
        print(f"FAIL training: {result.stderr.strip().splitlines()[-1:]}")
        return
    print(f"training {device} {summary['size']}: {summary['train_tokens_per_s']:,.0f} tokens/s, "
          f"peak {summary['peak_gib']} GiB")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--items", type=int, default=64, help="user-turn prompts")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--batches", default="16,64", help="batch sizes of the overhead check")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--turns", type=int, default=64, help="turns the CPU labels")
    parser.add_argument("--gpu-turns", type=int, default=512, help="turns the GPU labels")
    parser.add_argument("--train-size", default="2b")
    parser.add_argument("--train-steps", type=int, default=10)
    args = parser.parse_args(argv)

    start = time.perf_counter()
    cuda = torch.cuda.is_available()
    print(f"gpu check: {torch.cuda.get_device_name(0) if cuda else 'no CUDA device'}, torch "
          f"{torch.__version__}, model {args.model}")
    if cuda:
        greedy_identity(args.model, min(args.items, 16), args.max_tokens)
    else:
        print("SKIP greedy identity cuda vs cpu: no CUDA device")
    device = "cuda" if cuda else "cpu"
    backend = load_backend(args.model, batch_size=16, device=device)
    assert isinstance(backend, TransformersBackend)
    harness_overhead(backend, device, args.items, [int(b) for b in args.batches.split(",")],
                     args.max_tokens, args.repeats)
    del backend
    labelling(args.model, args.turns, args.gpu_turns, cuda)
    training(args.train_size, args.train_steps, cuda)
    print(f"gpu check done in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
