"""executor: ray with vLLM replicas on one large GPU: throughput of 1 and 2 replicas.

Sized for one run of under 10 minutes on an 80-140 GB GPU, without network:

    RAY_AUTH_MODE=disabled PYTHONPATH=src python benchmarks/gpu_ray_vllm.py

The model is built from a config (no download): the tiny model's tokenizer and ChatML template
with a Qwen2 body of about 0.6B parameters in bfloat16, random weights (throughput does not care
what the weights say). Each replica is a Ray actor holding one ``vllm.LLM`` with half the GPU
(``gpus_per_replica: 0.5``, ``gpu_memory_utilization: 0.4``). Prints one line per replica count,
the ratio, how many greedy generations the two runs share, and PASS when both stored every
planned generation without error (exit 0).
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from pathlib import Path


def build_model(folder: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from userturn.backends.tiny import build_tiny_model

    tiny = build_tiny_model(folder / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    small = Qwen2Config.from_pretrained(tiny)
    config = Qwen2Config(vocab_size=small.vocab_size, hidden_size=1536, intermediate_size=6144,
                         num_hidden_layers=20, num_attention_heads=12, num_key_value_heads=2,
                         max_position_embeddings=4096, eos_token_id=small.eos_token_id,
                         pad_token_id=small.pad_token_id, bos_token_id=small.bos_token_id,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = small.eos_token_id
    out = folder / "built"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters in {out}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=200, help="items")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()

    import ray

    from userturn.backends import BackendSpec
    from userturn.config import Experiment
    from userturn.probe.pipeline import run_experiment
    from userturn.probe.ray_executor import RayExecutor

    root = Path(tempfile.mkdtemp(prefix="userturn-gpu-ray-"))
    model = f"vllm/{build_model(root)}"
    engine = {"gpu_memory_utilization": 0.4, "max_model_len": 2048}
    ray.init(include_dashboard=False, log_to_driver=False)
    rates, greedy, errors = {}, {}, 0
    try:
        for replicas in (1, 2):
            exp = Experiment(models=[model], datasets=["gsm_symbolic"], limit=args.limit,
                             temperatures=[0.0, 1.0], samples=args.samples,
                             max_tokens=args.max_tokens, user_max_tokens=args.max_tokens,
                             backend_args=engine, output=root / f"replicas{replicas}")
            started = time.perf_counter()
            spec = BackendSpec(model, backend_args=engine)
            with RayExecutor([spec], replicas=replicas, gpus_per_replica=0.5,
                             unit_size=256) as executor:
                ready = time.perf_counter()
                run_experiment(exp, backends=executor.backends, executor=executor).close()
                seconds = time.perf_counter() - ready
            with sqlite3.connect(exp.plan.output / "userturn.db") as db:
                made = db.execute("SELECT COUNT(*), SUM(completion_tokens) FROM generations "
                                  "WHERE error IS NULL AND role != 'human'").fetchone()
                errors += db.execute("SELECT COUNT(*) FROM generations WHERE error IS NOT "
                                     "NULL").fetchone()[0]
                greedy[replicas] = db.execute("SELECT key, raw_text FROM generations WHERE "
                                              "temperature = 0 ORDER BY key").fetchall()
            rates[replicas] = made[0] / seconds
            print(f"{replicas} replica(s): engines up in {ready - started:.0f} s; {made[0]} "
                  f"generations, {made[1]} tokens in {seconds:.1f} s = {rates[replicas]:.1f} "
                  f"generations/s, {made[1] / seconds:.0f} tokens/s")
    finally:
        ray.shutdown()
    print(f"ratio 2 replicas / 1 replica: {rates[2] / rates[1]:.2f}")
    # bfloat16 batches are not batch-invariant: on random weights a few greedy turns may differ
    # with the batch they ran in, so this is a figure, not a pass/fail.
    same = sum(a == b for a, b in zip(greedy[1], greedy[2]))
    print(f"greedy generations equal between 1 and 2 replicas: {same}/{len(greedy[1])}")
    complete = len(greedy[1]) == len(greedy[2]) and errors == 0
    print(f"{'PASS' if complete else 'FAIL'} both runs stored every planned generation")
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
