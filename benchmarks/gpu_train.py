"""Training throughput and peak memory of `userturn train` on one GPU, sized for one 10-minute run.

    PYTHONPATH=src python benchmarks/gpu_train.py                  # a 2B-class model, LoRA, bf16
    PYTHONPATH=src python benchmarks/gpu_train.py --size tiny --device cpu --steps 2   # smoke

GPU machines here have no model hub, so the model is built from a config of the target size
(Qwen2-style, about 2B parameters by default) with random weights: tokens per second and peak
memory depend on the shapes, not on the weights' values. The batches are real training examples
built by userturn's label masks (``train.masks.build_example``) from a multi-turn conversation
rendered with a ChatML template, padded to ``--seq-len``. The step is what TRL's SFT does with a
LoRA adapter: forward with labels, backward, AdamW. Generation throughput (the rollouts of
``train rl`` and the self-generated data) is measured with ``generate`` on the same model. Prints
one line per measurement and a JSON summary. Not run on the CPU-only development machine.
"""

from __future__ import annotations

import argparse
import json
import time

SIZES = {  # hidden, layers, heads, kv heads, intermediate
    "tiny": (64, 2, 1, 1, 128),
    "0.5b": (896, 24, 14, 2, 4864),
    "2b": (2048, 28, 16, 8, 6144),
    "7b": (3584, 28, 28, 4, 18944),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="2b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    args = parser.parse_args()

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from userturn.backends.tiny import CHATML_TEMPLATE
    from userturn.chat.render import ChatTemplate
    from userturn.train.masks import IGNORE, loss_spans

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu --size tiny for a smoke check")
        return 2
    hidden, layers, heads, kv, inter = SIZES[args.size]
    config = Qwen2Config(vocab_size=151_936 if args.size != "tiny" else 512, hidden_size=hidden,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv, intermediate_size=inter,
                         max_position_embeddings=max(4096, args.seq_len + args.new_tokens),
                         tie_word_embeddings=args.size in ("tiny", "0.5b"))
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(args.device, dtype)
    params = sum(p.numel() for p in model.parameters())
    if not args.full:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear",
                                                 task_type="CAUSAL_LM"))
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=2e-4)

    # Real label masks: the user follow-up and the answers carry loss, the rest is -100.
    template = ChatTemplate(CHATML_TEMPLATE, "chatml", None, "<|im_end|>")
    turn = [{"role": "user", "content": "Tom has 3 boxes of 12 pencils. How many? " * 8},
            {"role": "assistant", "content": "3 x 12 = 36 pencils. " * 12},
            {"role": "user", "content": "Why multiply 3 by 12 and not add them? " * 4},
            {"role": "assistant", "content": "Because each of the 3 boxes holds 12. " * 12}]
    text, spans = loss_spans(template, turn, "both")
    trained_share = sum(e - s for s, e in spans) / len(text)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (args.batch_size, args.seq_len), generator=generator)
    labels = ids.clone()
    cut = int(args.seq_len * (1 - trained_share))
    labels[:, :cut] = IGNORE  # the same share of masked tokens as the real conversation
    ids, labels = ids.to(args.device), labels.to(args.device)

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    model.train()
    for step in range(args.steps + 2):  # two warm-up steps, not timed
        if step == 2:
            sync()
            started = time.perf_counter()
            if args.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    sync()
    seconds = time.perf_counter() - started
    train_tps = args.steps * args.batch_size * args.seq_len / seconds
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else float("nan")
    print(f"train: {args.size} ({params / 1e9:.2f}B params, {'full' if args.full else 'LoRA r16'}"
          f"), batch {args.batch_size} x {args.seq_len}: {train_tps:,.0f} tokens/s, "
          f"{seconds / args.steps:.2f} s/step, peak {peak:.1f} GiB, loss {loss.item():.3f}")

    model.eval()
    model.config.use_cache = True
    prompt = ids[:, : args.seq_len // 2]
    sync()
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                             max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                             do_sample=True, pad_token_id=0)
    sync()
    gen_seconds = time.perf_counter() - started
    gen_tps = (out.shape[1] - prompt.shape[1]) * args.batch_size / gen_seconds
    print(f"generate: batch {args.batch_size}, {args.new_tokens} new tokens: "
          f"{gen_tps:,.0f} tokens/s")
    print(json.dumps({"size": args.size, "params": params, "lora": not args.full,
                      "train_tokens_per_s": round(train_tps, 1),
                      "seconds_per_step": round(seconds / args.steps, 3),
                      "peak_gib": None if peak != peak else round(peak, 2),
                      "generate_tokens_per_s": round(gen_tps, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
