"""Candidate user-turn classifiers on the corpus's dev split, and the final test-split figures.

    .venv/bin/python benchmarks/classifier_compare.py                    # dev: every family
    .venv/bin/python benchmarks/classifier_compare.py --smollm2          # + SmolLM2 hidden states
    .venv/bin/python benchmarks/classifier_compare.py --split test       # the shipped labellers

Families (all fit on the train split only; dev picks among them; test is read once, for the
shipped labellers):
  rules            the rule classifier (undecided counts as a wrong label)
  text-lr          logistic regression on hashed words and character 3-grams only
  features-lr      the shipped design: the rules' verdict and signals + hashed text (C on a grid)
  features-gbm     gradient-boosted trees on the rules' verdict and signals (no text)
  smollm2-lr       SmolLM2-135M's frozen last hidden state (mean over the turn) + logistic head
  cascade          rules where they decide, features-lr elsewhere
Each row: Cohen's kappa 7-way and follow-up vs rest, macro F1, follow-up precision/recall,
turns/s on this machine (one process, one thread), and the size of the parameters.
"""

from __future__ import annotations

import argparse
import io
import time
from typing import Callable, Sequence

import numpy as np

from userturn.labels.classifier import MODEL_FILE, N_DENSE, LearnedClassifier, design_matrix, rule_features
from userturn.labels.training import Example, calibrate, evaluate, fit, predict
from userturn.labels.corpus import corpus_examples
from userturn.records import LABELS, Case, Label
from userturn.labels.rules import RulesClassifier


def macro_f1(per_label: dict) -> float:
    scores = []
    for row in per_label.values():
        p, r = row["precision"], row["recall"]
        scores.append(0.0 if not (p + r) or np.isnan(p) or np.isnan(r) else 2 * p * r / (p + r))
    return float(np.mean(scores)) if scores else float("nan")


def timed(labeller: Callable[[Case], Label], examples: Sequence[Example]):
    start = time.perf_counter()
    labels, probs = predict(labeller, examples)
    return labels, probs, len(examples) / (time.perf_counter() - start)


def row(name: str, labels, examples, speed: float, size: int, probs=None) -> str:
    result = evaluate(labels, [ex.label for ex in examples], probs)
    f = result.per_label.get("follow_up", {"precision": float("nan"), "recall": float("nan")})
    return (f"| {name:<16} | {result.kappa:6.3f} | {result.kappa_follow_up:6.3f} | "
            f"{macro_f1(result.per_label):5.3f} | {f['precision']:5.2f} | {f['recall']:5.2f} | "
            f"{speed:8.0f} | {size / 1024:7.0f} KB |")


HEADER = ("| labeller         | kappa7 | kappaF | macF1 | F-P   | F-R   | turns/s  | size       |\n"
          "|------------------|--------|--------|-------|-------|-------|----------|------------|")


def gbm(train: Sequence[Example], dev: Sequence[Example]):
    from sklearn.ensemble import HistGradientBoostingClassifier

    x = np.array([rule_features(ex.case) for ex in train])
    model = HistGradientBoostingClassifier(max_iter=300, learning_rate=0.08,
                                           class_weight="balanced", random_state=0)
    model.fit(x, [ex.label for ex in train])
    start = time.perf_counter()
    labels = list(model.predict(np.array([rule_features(ex.case) for ex in dev])))
    speed = len(dev) / (time.perf_counter() - start)
    buffer = io.BytesIO()
    import pickle

    pickle.dump(model, buffer)
    return labels, speed, len(buffer.getvalue())


def text_only(train: Sequence[Example], dev: Sequence[Example]):
    from sklearn.linear_model import LogisticRegression

    x = design_matrix([ex.case for ex in train])[:, N_DENSE:]
    model = LogisticRegression(C=4.0, max_iter=3000, class_weight="balanced")
    model.fit(x, [ex.label for ex in train])
    start = time.perf_counter()
    labels = list(model.predict(design_matrix([ex.case for ex in dev])[:, N_DENSE:]))
    return labels, len(dev) / (time.perf_counter() - start), model.coef_.size * 4


def smollm2_states(examples: Sequence[Example], tokenizer, model) -> np.ndarray:
    import torch

    out = []
    with torch.inference_mode():
        for ex in examples:
            text = (f"Query: {ex.case.query[-600:]}\nAnswer: {ex.case.answer[-1200:]}\n"
                    f"Next user turn: {ex.case.user_turn[:800]}")
            ids = tokenizer(text, return_tensors="pt", truncation=True, max_length=512)
            hidden = model(**ids).last_hidden_state[0]
            start = len(tokenizer(text[:text.index("Next user turn:")])["input_ids"])
            out.append(hidden[max(0, start - 1):].mean(0).numpy())
    return np.stack(out)


def smollm2_head(train: Sequence[Example], dev: Sequence[Example]):
    import torch
    from sklearn.linear_model import LogisticRegression
    from transformers import AutoModel, AutoTokenizer

    from userturn.models import materialize_embedded

    torch.set_num_threads(1)
    folder, _ = materialize_embedded("smollm2")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder, torch_dtype=torch.float32).eval()
    x_train = smollm2_states(train, tokenizer, model)
    head = LogisticRegression(C=1.0, max_iter=3000, class_weight="balanced")
    mean, std = x_train.mean(0), x_train.std(0) + 1e-6
    head.fit((x_train - mean) / std, [ex.label for ex in train])
    start = time.perf_counter()
    x_dev = smollm2_states(dev, tokenizer, model)
    labels = list(head.predict((x_dev - mean) / std))
    speed = len(dev) / (time.perf_counter() - start)
    size = sum(p.numel() for p in model.parameters()) * 4 + head.coef_.size * 4
    return labels, speed, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=("dev", "test"), default="dev")
    parser.add_argument("--smollm2", action="store_true", help="also the hidden-state family "
                        "(slow on CPU: it runs SmolLM2 over every turn)")
    args = parser.parse_args()
    train, dev = corpus_examples("train"), corpus_examples(args.split)
    print(f"train {len(train)} turns, {args.split} {len(dev)} turns\n\n{HEADER}")
    rules = RulesClassifier()
    labels, _, speed = timed(rules.classify, dev)
    print(row("rules", labels, dev, speed, 0))
    if args.split == "test":
        shipped = LearnedClassifier()
        size = MODEL_FILE.stat().st_size
        labels, probs, speed = timed(shipped.classify, dev)
        print(row("classifier", labels, dev, speed, size, probs))
        cascade = lambda c: (lambda r: r if r.label else shipped.classify(c))(rules.classify(c))  # noqa
        labels, probs, speed = timed(cascade, dev)
        print(row("cascade", labels, dev, speed, size, probs))
        per_source(shipped, cascade, dev)
        return
    labels, speed, size = text_only(train, dev)
    print(row("text-lr", labels, dev, speed, size))
    validation = corpus_examples("dev")
    best = None
    for c in (0.25, 0.5, 2.0):
        model = calibrate(fit(train, c=c), validation)
        clf = LearnedClassifier(model)
        labels, probs, speed = timed(clf.classify, dev)
        print(row(f"features-lr C={c:g}", labels, dev, speed, model.weights.size * 4, probs))
        kappa = evaluate(labels, [ex.label for ex in dev]).kappa
        if best is None or kappa > best[0]:
            best = (kappa, clf, c)
    labels, speed, size = gbm(train, dev)
    print(row("features-gbm", labels, dev, speed, size))
    if args.smollm2:
        labels, speed, size = smollm2_head(train, dev)
        print(row("smollm2-lr", labels, dev, speed, size))
    _, clf, c = best
    cascade = lambda case: (lambda r: r if r.label else clf.classify(case))(rules.classify(case))  # noqa
    labels, probs, speed = timed(cascade, dev)
    print(row(f"cascade C={c:g}", labels, dev, speed, clf.model.weights.size * 4, probs))


def per_source(shipped: LearnedClassifier, cascade, examples: Sequence[Example]) -> None:
    kinds = sorted({ex.source for ex in examples})
    print("\nper source (test split): n, kappa 7-way, follow-up precision / recall")
    for kind in kinds:
        subset = [ex for ex in examples if ex.source == kind]
        for name, labeller in (("classifier", shipped.classify), ("cascade", cascade)):
            labels, _ = predict(labeller, subset)
            result = evaluate(labels, [ex.label for ex in subset])
            f = result.per_label.get("follow_up")
            fp = f"{f['precision']:.2f} / {f['recall']:.2f}" if f else "-"
            print(f"  {kind:<10} {name:<10} n={result.n:<4} kappa {result.kappa:.3f}  F {fp}")
    labels, _ = predict(cascade, examples)
    result = evaluate(labels, [ex.label for ex in examples])
    print("\nper label (cascade, test split): precision / recall / support")
    for name in LABELS:
        if name in result.per_label:
            r = result.per_label[name]
            print(f"  {name:<16} {r['precision']:.2f} / {r['recall']:.2f} / {r['support']}")


if __name__ == "__main__":
    main()
