"""Candidate user-turn classifiers on the corpus's dev split, and the final test-split figures.

    .venv/bin/python benchmarks/classifier_compare.py                    # dev: every family
    .venv/bin/python benchmarks/classifier_compare.py --smollm2          # + SmolLM2 hidden states
    .venv/bin/python benchmarks/classifier_compare.py --split test       # the shipped labellers
    .venv/bin/python benchmarks/classifier_compare.py --limit 150        # smoke: fewer turns

Families (all fit on the train split only; dev picks among them; test is read once, for the
shipped labellers):
  rules            the rule classifier (undecided counts as a wrong label)
  text-lr          logistic regression on hashed words and character 3-grams only
  features-lr      the shipped design: the rules' verdict and signals + hashed text (C on a grid)
  features-gbm     gradient-boosted trees on the rules' verdict and signals (no text)
  smollm2-lr       SmolLM2-135M's frozen last hidden state (mean over the turn) and the turn's
                   negative log-likelihood under it, + a logistic head
  features+smollm2 the shipped design's features with those SmolLM2 features beside them
  cascade          rules where they decide, features-lr elsewhere
Each row: Cohen's kappa 7-way and follow-up vs rest, macro F1, follow-up precision/recall,
turns/s on this machine (one process, one thread), and the size of the parameters.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import io
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from userturn.labels.classifier import (
    MODEL_FILE,
    N_DENSE,
    LearnedClassifier,
    design_matrix,
    rule_features,
    rule_of,
)
from userturn.labels.corpus import corpus_examples
from userturn.labels.rules import RulesClassifier
from userturn.labels.sources import labeller_named
from userturn.labels.training import Example, calibrate, evaluate, fit, predict, standardised_design
from userturn.records import LABELS, Case, Label


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
    rate = f"{speed:8.0f}" if speed >= 10 else f"{speed:8.2f}"  # SmolLM2 runs below one turn/s
    return (f"| {name:<22} | {result.kappa:6.3f} | {result.kappa_follow_up:6.3f} | "
            f"{macro_f1(result.per_label):5.3f} | {f['precision']:5.2f} | {f['recall']:5.2f} | "
            f"{rate} | {size / 1024:7.0f} KB |")


HEADER = ("| labeller               | kappa7 | kappaF | macF1 | F-P   | F-R   | turns/s  | size       |\n"
          "|------------------------|--------|--------|-------|-------|-------|----------|------------|")


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


STATES_CACHE = Path("runs/smollm2_states.npz")  # per-turn SmolLM2 features, keyed by text


def _key(case: Case) -> str:
    return hashlib.sha256(f"{case.query}\x00{case.answer}\x00{case.user_turn}".encode()).hexdigest()[:20]


@functools.lru_cache(maxsize=1)
def _smollm2():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from userturn.backends.models import materialize_embedded

    torch.set_num_threads(1)
    folder, _ = materialize_embedded("smollm2")
    return (AutoTokenizer.from_pretrained(folder),
            AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval())


def smollm2_states(examples: Sequence[Example], cache: Path = STATES_CACHE) -> np.ndarray:
    """Per turn: SmolLM2-135M's last hidden state averaged over the turn's tokens, the mean and
    90th-percentile negative log-likelihood of those tokens (how likely the turn reads to the model;
    on the corpus it tracks the sampling temperature more than coherence) and log(1 + tokens), with
    the last 400 characters of the answer as context. Cached by text and saved as it goes (the
    run is long on a CPU and resumes after a kill); the key is the text alone, so delete the
    cache after changing this recipe."""
    import torch

    done: dict[str, np.ndarray] = {}
    if cache.exists():
        with np.load(cache) as data:
            done = dict(zip(data["keys"].tolist(), data["values"]))
    missing = [ex for ex in examples if _key(ex.case) not in done]
    if missing:
        tokenizer, model = _smollm2()
        started = time.perf_counter()
        with torch.inference_mode():
            for index, ex in enumerate(missing, 1):
                prefix = tokenizer(f"Assistant: {ex.case.answer[-400:]}\nUser:")["input_ids"][-160:]
                turn = tokenizer(" " + ex.case.user_turn[:600])["input_ids"][:128] or [tokenizer.eos_token_id]
                ids = torch.tensor([prefix + turn])
                out = model(input_ids=ids, output_hidden_states=True)
                hidden = out.hidden_states[-1][0, len(prefix):]
                logp = torch.log_softmax(out.logits[0, len(prefix) - 1:-1].float(), dim=-1)
                nll = -logp[torch.arange(len(turn)), torch.tensor(turn)]
                done[_key(ex.case)] = np.concatenate(
                    [hidden.mean(0).numpy(), [float(nll.mean()), float(nll.quantile(0.9)),
                                              float(np.log1p(len(turn)))]]).astype(np.float32)
                if index % 50 == 0 or index == len(missing):
                    cache.parent.mkdir(parents=True, exist_ok=True)
                    with open(cache.with_suffix(".partial"), "wb") as handle:
                        np.savez(handle, keys=np.array(list(done)), values=np.stack(list(done.values())))
                    cache.with_suffix(".partial").replace(cache)
                    rate = index / (time.perf_counter() - started)
                    print(f"  smollm2 states: {index}/{len(missing)} ({rate:.2f} turns/s)", flush=True)
    return np.stack([done[_key(ex.case)] for ex in examples])


def smollm2_speed(examples: Sequence[Example]) -> float:
    """Turns/s of the state computation alone (20 turns, uncached, the model already loaded)."""
    sample = list(examples[:20])
    _smollm2()
    timing = Path("runs/smollm2_states_timing.npz")
    timing.unlink(missing_ok=True)  # left by a killed run, it would make the rate meaningless
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # its progress line is not a table row
        smollm2_states(sample, cache=timing)
    timing.unlink(missing_ok=True)
    return len(sample) / (time.perf_counter() - start)


def smollm2_heads(train: Sequence[Example], dev: Sequence[Example]):
    """Two heads on the SmolLM2 features: alone, and stacked with the shipped design's features."""
    from scipy import sparse
    from sklearn.linear_model import LogisticRegression

    s_train, s_dev = smollm2_states(train), smollm2_states(dev)
    mean, std = s_train.mean(0), s_train.std(0) + 1e-6
    s_train, s_dev = (s_train - mean) / std, (s_dev - mean) / std
    y = [ex.label for ex in train]
    rows = []
    for c in (0.05, 0.5):
        head = LogisticRegression(C=c, max_iter=5000, class_weight="balanced").fit(s_train, y)
        rows.append((f"smollm2-lr C={c:g}", list(head.predict(s_dev)), head.coef_.size * 4))

    x_train, scale = standardised_design([ex.case for ex in train])  # as the shipped fit
    x_dev, _ = standardised_design([ex.case for ex in dev], scale)
    for weight in (0.1, 0.3):  # how much the states count beside the shipped features
        head = LogisticRegression(C=0.25, max_iter=5000, class_weight="balanced")
        head.fit(sparse.hstack([x_train, s_train * weight]).tocsr(), y)
        labels = list(head.predict(sparse.hstack([x_dev, s_dev * weight]).tocsr()))
        rows.append((f"features+smollm2 w={weight:g}", labels, head.coef_.size * 4))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=("dev", "test"), default="dev")
    parser.add_argument("--smollm2", action="store_true", help="also the hidden-state family "
                        "(slow on CPU: it runs SmolLM2 over every turn)")
    parser.add_argument("--limit", type=int, help="at most this many turns of each split, every "
                        "k-th one so each label keeps its share (a smoke run; the figures need all)")
    args = parser.parse_args(argv)
    train, dev = thin(corpus_examples("train"), args.limit), thin(corpus_examples(args.split), args.limit)
    print(f"train {len(train)} turns, {args.split} {len(dev)} turns\n\n{HEADER}")
    rules = RulesClassifier()
    labels, _, speed = timed(rules.classify, dev)
    print(row("rules", labels, dev, speed, 0))
    if args.split == "test":
        shipped = LearnedClassifier()
        size = MODEL_FILE.stat().st_size
        labels, probs, speed = timed(shipped.classify, dev)
        print(row("classifier", labels, dev, speed, size, probs))
        cascade = labeller_named("cascade").case_labeller(learned=shipped).classify
        labels, probs, speed = timed(cascade, dev)
        print(row("cascade", labels, dev, speed, size, probs))
        per_source(shipped, cascade, dev)
        print("\n95% intervals (bootstrap over the split's queries, 1000 draws): kappa 7-way, follow-up")
        for name, labeller in (("classifier", shipped.classify), ("cascade", cascade),
                               ("rules", rules.classify)):
            print(f"  {name:<10} " + clustered_interval(labeller, dev))
        return
    labels, speed, size = text_only(train, dev)
    print(row("text-lr", labels, dev, speed, size))
    validation = thin(corpus_examples("dev"), args.limit)
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
        speed = smollm2_speed(dev)
        model_size = sum(p.numel() for p in _smollm2()[1].parameters()) * 4  # fp32
        for name, labels, size in smollm2_heads(train, dev):
            print(row(name, labels, dev, speed, model_size + size))
    _, clf, c = best
    rule_precision(train)
    by_rules, _ = predict(rules.classify, dev)
    by_clf, _ = predict(clf.classify, dev)
    decided = [i for i, label in enumerate(by_rules) if label != "undecided"]
    print(f"on the {len(decided)} dev turns the rules decide, right: rules "
          f"{sum(by_rules[i] == dev[i].label for i in decided)}, features-lr "
          f"C={c:g} {sum(by_clf[i] == dev[i].label for i in decided)}")
    errors: dict[tuple[str, ...], int] = {}
    for ex, guess in zip(dev, by_clf):
        if guess != ex.label:
            pair = tuple(sorted((ex.label, str(guess))))
            errors[pair] = errors.get(pair, 0) + 1
    print(f"commonest errors of features-lr C={c:g} on dev ({sum(errors.values())} in all): "
          + ", ".join(f"{a} / {b} {n}" for (a, b), n in
                      sorted(errors.items(), key=lambda kv: -kv[1])[:4]) + "\n")
    labels, probs, speed = timed(labeller_named("cascade").case_labeller(learned=clf).classify, dev)
    print(row(f"cascade C={c:g}", labels, dev, speed, clf.model.weights.size * 4, probs))


def thin(examples: list[Example], limit: int | None) -> list[Example]:
    """Every k-th example, at most ``limit`` of them (all with no limit)."""
    if limit is None or len(examples) <= limit:
        return examples
    return examples[:: -(-len(examples) // limit)]


def clustered_interval(labeller: Callable[[Case], Label], examples: Sequence[Example],
                       draws: int = 1000, seed: int = 0) -> str:
    """Percentile intervals of both kappas, resampling whole queries (a query's turns move
    together: they are not independent)."""
    labels, _ = predict(labeller, examples)
    groups: dict[str, list[int]] = {}
    for index, ex in enumerate(examples):
        groups.setdefault(ex.group, []).append(index)
    members = list(groups.values())
    rng = np.random.default_rng(seed)
    k7, kf = [], []
    for _ in range(draws):
        picked = [i for g in rng.integers(0, len(members), len(members)) for i in members[g]]
        result = evaluate([labels[i] for i in picked], [examples[i].label for i in picked])
        k7.append(result.kappa)
        kf.append(result.kappa_follow_up)
    low7, high7 = np.nanpercentile(k7, [2.5, 97.5])
    lowf, highf = np.nanpercentile(kf, [2.5, 97.5])
    return (f"[{low7:.2f}, {high7:.2f}]  [{lowf:.2f}, {highf:.2f}]  "
            f"({len(members)} queries, {len(examples)} turns)")


def rule_precision(examples: Sequence[Example]) -> None:
    """How often each rule's verdict matches the adjudicated label: the cascade trusts all of them.
    (The rules are not fit to the corpus, so the train split measures them as well as any.)"""
    counts: dict[tuple[str, str], list[int]] = {}
    rules = RulesClassifier()
    for ex in examples:
        verdict = rules.classify(ex.case)
        if verdict.label is None:
            continue
        rule = rule_of(verdict).strip()[:52]
        tally = counts.setdefault((verdict.label, rule), [0, 0])
        tally[0] += 1
        tally[1] += verdict.label == ex.label
    print(f"\nthe rules' precision by rule ({len(examples)} train turns; rules decide "
          f"{sum(n for n, _ in counts.values())}): n, precision, label, rule")
    for (label, rule), (n, right) in sorted(counts.items(), key=lambda kv: -kv[1][0]):
        if n >= 5:
            print(f"  {n:4d}  {right / n:4.2f}  {label:<16} {rule}")
    print()


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
            print(f"  {name:<22} {r['precision']:.2f} / {r['recall']:.2f} / {r['support']}")


if __name__ == "__main__":
    main()
