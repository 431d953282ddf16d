"""Leave one generator out for a fine-tuned neural labeller: SmolLM2-135M's top layers adapted.

    .venv/bin/python benchmarks/finetuned_lomo.py                       # states, then every fold
    .venv/bin/python benchmarks/finetuned_lomo.py --limit 200 --epochs 1  # smoke

The third family of docs/classifier.md's comparison, beside the linear model on the turn's form
and the linear model on what the embedded SmolLM2 reads of the turn in context
(benchmarks/leave_one_model_out.py): a neural classifier trained end to end over the answer's tail
and the turn. It is the embedded SmolLM2-135M-Instruct with low-rank adapters (LoRA) on every
projection of its top ``--layers`` decoder layers and a linear head over the turn's mean final
state, trained on CPU.

What makes it trainable on two CPU cores: the lower layers are frozen, so their output is read
once per turn and cached (``--states``, resumable); and the adapters act on the turn's tokens
only, attending to the context's keys and values as the frozen model wrote them, so a training
step runs the top layers over the turn (at most 49 tokens), never over the query and answer.

Each fold fits on every group but the held-out one (train split), picks the epoch by the fit
groups' dev split, and scores ALL the held-out group's turns as the cascade (the rules where they
decide, the network elsewhere) and as the network alone, in the same format as
leave_one_model_out.py.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from leave_one_model_out import (  # noqa: E402
    Turn,
    held_out_row,
    print_rate_gaps,
    rate_gaps,
    read_corpus,
)

from userturn.labels.context import ContextScorer, turn_key  # noqa: E402
from userturn.labels.rules import RulesClassifier  # noqa: E402
from userturn.labels.training import evaluate  # noqa: E402
from userturn.records import LABELS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# The whole cache is rewritten at each save (about 1 GB for the corpus): seldom enough that the
# rewrites stay a small part of the reading, often enough that a kill loses minutes.
SAVE_EVERY = 500
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# -- the frozen lower layers, read once per turn ------------------------------------------------

def read_states(scorer: ContextScorer, turns: Sequence[Turn], layers: int, path: Path) -> dict:
    """Per turn key: the turn's tokens' input to the first adapted layer, and the context's keys
    and values in every adapted layer (fp16), as the frozen model computes them over the
    conversation query -> answer -> turn (clipped as the context scorer clips). Saved to ``path``
    every SAVE_EVERY turns and at the end: a killed run resumes, losing at most that many."""
    states: dict = torch.load(path) if path.exists() else {}
    model = scorer.model
    first = model.config.num_hidden_layers - layers
    todo = {key_of(t): t.example.case for t in turns if key_of(t) not in states}
    started, done = time.monotonic(), 0
    for key, case in todo.items():
        context, turn = scorer.conversation_ids(case)
        with torch.inference_mode():
            out = model(torch.tensor([context + turn]), use_cache=True, output_hidden_states=True,
                        logits_to_keep=1)
        cache = out["cache"] if "cache" in out else out["past_key_values"]  # transformers 5 / 4
        c = len(context)
        states[key] = {
            "turn_in": out.hidden_states[first][0, c:].half().clone(),
            "keys": torch.stack([cache.layers[i].keys[0, :, :c] for i in range(first, first + layers)]
                                ).half().clone(),
            "values": torch.stack([cache.layers[i].values[0, :, :c]
                                   for i in range(first, first + layers)]).half().clone(),
            "final": out.hidden_states[-1][0, c:].mean(0).clone(),  # to check the adapted path
            "context": c,
        }
        done += 1
        if done % SAVE_EVERY == 0 or done == len(todo):
            torch.save(states, path)
            rate = done / (time.monotonic() - started)
            print(f"  states: {done}/{len(todo)} ({rate:.1f} turns/s)", flush=True)
    return states


# -- the adapted top layers ---------------------------------------------------------------------

class LoRA(nn.Module):
    """``base(x) + B(A(x)) * scale`` with ``base`` frozen and ``B`` starting at zero."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = base
        self.a = nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))
        self.b = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.a.T @ self.b.T) * self.scale


class AdaptedTop(nn.Module):
    """The model's top decoder layers, run over the turn's tokens only (the context enters as
    its cached keys and values), then the final norm, a mean over the turn, and a linear head."""

    def __init__(self, scorer: ContextScorer, layers: int, rank: int, alpha: float,
                 labels: Sequence[str], dropout: float, full: bool = False) -> None:
        super().__init__()
        import copy

        model = scorer.model
        config = model.config
        first = config.num_hidden_layers - layers
        self.layers = nn.ModuleList(copy.deepcopy(model.model.layers[first:]))
        self.norm = copy.deepcopy(model.model.norm)
        self.rotary = model.model.rotary_emb
        for p in self.parameters():
            p.requires_grad_(full)  # --full: the top layers' own weights are trained
        if rank and not full:
            for layer in self.layers:
                for owner in (layer.self_attn, layer.mlp):
                    for name in PROJECTIONS:
                        if hasattr(owner, name):
                            setattr(owner, name, LoRA(getattr(owner, name), rank, alpha))
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(config.hidden_size, len(labels))
        self.labels = tuple(labels)

    def pooled(self, batch: Sequence[dict]) -> torch.Tensor:
        """The mean final state over each turn's tokens: (batch, hidden)."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        b = len(batch)
        t_max = max(len(s["turn_in"]) for s in batch)
        c_max = max(s["context"] for s in batch)
        hidden = torch.zeros(b, t_max, self.head.in_features)
        positions = torch.zeros(b, t_max, dtype=torch.long)
        mask = torch.zeros(b, 1, t_max, c_max + t_max, dtype=torch.bool)
        valid = torch.zeros(b, t_max)
        causal = torch.tril(torch.ones(t_max, t_max, dtype=torch.bool))
        for i, s in enumerate(batch):
            t, c = len(s["turn_in"]), s["context"]
            hidden[i, :t] = s["turn_in"].float()
            positions[i] = c + torch.arange(t_max)
            mask[i, 0, :, :c] = True
            mask[i, 0, :, c_max:] = causal
            mask[i, 0, :, c_max + t:] = False
            mask[i, 0, t:, c_max:c_max + t_max] = torch.eye(t_max, dtype=torch.bool)[t:]  # pads
            valid[i, :t] = 1
        cos, sin = self.rotary(hidden, positions)
        for index, layer in enumerate(self.layers):
            keys = torch.zeros(b, self.kv_heads, c_max, self.head_dim)
            values = torch.zeros_like(keys)
            for i, s in enumerate(batch):
                keys[i, :, :s["context"]] = s["keys"][index].float()
                values[i, :, :s["context"]] = s["values"][index].float()
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            shape = (b, t_max, -1, self.head_dim)
            q = attn.q_proj(x).view(shape).transpose(1, 2)
            k = attn.k_proj(x).view(shape).transpose(1, 2)
            v = attn.v_proj(x).view(shape).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            k = torch.cat([keys, k], dim=2).repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = torch.cat([values, v], dim=2).repeat_interleave(self.heads // self.kv_heads, dim=1)
            out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            hidden = hidden + attn.o_proj(out.transpose(1, 2).reshape(b, t_max, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        hidden = self.norm(hidden)
        return (hidden * valid[..., None]).sum(1) / valid.sum(1, keepdim=True)

    def forward(self, batch: Sequence[dict]) -> torch.Tensor:
        return self.head(self.dropout(self.pooled(batch)))


def check_adapted_path(scorer: ContextScorer, states: dict, layers: int) -> float:
    """The largest gap between the adapted path with zero adapters and the frozen model's own
    final states (the cached ``final``): the cache and the top-layer code must agree."""
    net = AdaptedTop(scorer, layers, 0, 1.0, LABELS, 0.0).eval()
    sample = list(states.values())[:8]
    with torch.no_grad():
        pooled = net.pooled(sample)
    return max(float((s["final"] - p).abs().max()) for s, p in zip(sample, pooled))


# -- a fold ----------------------------------------------------------------------------------------

def train_fold(scorer: ContextScorer, states: dict, train: Sequence[Turn], dev: Sequence[Turn],
               args: argparse.Namespace, seed: int = 0) -> AdaptedTop:
    torch.manual_seed(seed)
    labels = [label for label in LABELS if any(t.example.label == label for t in train)]
    net = AdaptedTop(scorer, args.layers, args.rank, args.alpha, labels, args.dropout, args.full)
    y = torch.tensor([labels.index(t.example.label) for t in train])
    counts = torch.bincount(y, minlength=len(labels)).float()
    weights = counts.sum() / (len(labels) * counts.clamp(min=1))  # scikit-learn's "balanced"
    loss_fn = nn.CrossEntropyLoss(weight=weights)
    head = list(net.head.parameters())
    adapters = [p for n, p in net.named_parameters() if p.requires_grad and not n.startswith("head")]
    optimiser = torch.optim.AdamW([{"params": adapters, "lr": args.lr},
                                   {"params": head, "lr": args.head_lr}], weight_decay=0.01)
    keys = [key_of(t) for t in train]
    rng = np.random.default_rng(seed)
    best, best_state = -2.0, None
    for epoch in range(args.epochs):
        net.train()
        order = rng.permutation(len(train))
        started, total = time.monotonic(), 0.0
        for start in range(0, len(order), args.batch):
            chosen = order[start:start + args.batch]
            logits = net([states[keys[i]] for i in chosen])
            loss = loss_fn(logits, y[chosen])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            total += float(loss.detach()) * len(chosen)
        predicted = network_labels(net, states, dev)
        e = evaluate(predicted, [t.example.label for t in dev])
        print(f"    epoch {epoch + 1}: train loss {total / len(train):.3f}, dev kappa "
              f"{e.kappa:.3f} / {e.kappa_follow_up:.3f} ({time.monotonic() - started:.0f} s)",
              flush=True)
        if e.kappa > best:
            best = e.kappa
            best_state = {k: v.clone() for k, v in net.state_dict().items()}
    assert best_state is not None
    net.load_state_dict(best_state)
    return net


def key_of(turn: Turn) -> str:
    case = turn.example.case
    return turn_key(case.query, case.answer, case.user_turn)


def network_labels(net: AdaptedTop, states: dict, turns: Sequence[Turn], batch: int = 32
                   ) -> list[str]:
    net.eval()
    out: list[str] = []
    with torch.no_grad():
        for start in range(0, len(turns), batch):
            logits = net([states[key_of(t)] for t in turns[start:start + batch]])
            out += [net.labels[i] for i in logits.argmax(1).tolist()]
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=Path, default=ROOT / "corpus/work/turn-states.pt",
                        help="the frozen layers' cached output (built on first use, resumable)")
    parser.add_argument("--limit", type=int, default=None, help="smoke: about this many turns")
    parser.add_argument("--layers", type=int, default=2, help="top decoder layers adapted")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--full", action="store_true",
                        help="train the top layers' weights themselves, not low-rank adapters")
    parser.add_argument("--alpha", type=float, default=16.0)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--head-lr", type=float, default=2e-3)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--bootstrap", type=int, default=500)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    turns = read_corpus()
    if args.limit:
        turns = turns[:: max(1, len(turns) // args.limit)]
    scorer = ContextScorer()
    states = read_states(scorer, turns, args.layers, args.states)
    print(f"adapted path against the frozen model (zero adapters): max gap "
          f"{check_adapted_path(scorer, states, args.layers):.2e}")
    rules = RulesClassifier()
    ruled = {key_of(t): rules.classify(t.example.case).label for t in turns}
    adapted = "all weights" if args.full else f"LoRA rank {args.rank}"
    print(f"{len(turns)} turns; {args.layers} layers, {adapted}, {args.epochs} epochs, lr {args.lr}")
    print("| held out | labeller | n | kappa7 [95% CI] | kappaF [95% CI] | F-P | F-R |")
    print("|---|---|---|---|---|---|---|")
    gaps: list[str] = []
    for held in ("smollm2", "qwen2.5-coder-1.5b", "human"):
        test = [t for t in turns if t.generator == held]
        if not test:
            continue
        fit_on = [t for t in turns if t.generator != held]
        train = [t for t in fit_on if t.example.split == "train"]
        dev = [t for t in fit_on if t.example.split == "dev"]
        print(f"  fold {held}: train {len(train)}, dev {len(dev)}, held out {len(test)}",
              file=sys.stderr, flush=True)
        net = train_fold(scorer, states, train, dev, args)
        alone = network_labels(net, states, test)
        cascade = [ruled[key_of(t)] or label for t, label in zip(test, alone)]
        family = "top layers trained" if args.full else "LoRA top layers"
        for name, predicted in ((f"network ({family})", alone), (f"cascade ({family})", cascade)):
            print(held_out_row(held, name, test, predicted, args.bootstrap), flush=True)
            if name.startswith("cascade"):
                gaps += rate_gaps(held, name, test, predicted)
    print_rate_gaps(gaps)


if __name__ == "__main__":
    main()
