"""What labelling costs beside the generation it labels, measured side by side in one process.

SmolLM2 (the demo's model, transformers, batch 8) writes user turns after the reference solutions
of GSM-Symbolic items in the demo's design: per item one greedy turn and ``--samples`` at T = 1.0,
all after the same answer. Then the offline cascade labels the same turns the way `userturn
label` does (the turns after one answer read ahead together, then each labelled). Prints both
rates and the ratio of labelling time to generation time (target: at most 0.25). Loading is
outside both timings: the backend's model before generating, and the classifier's context
scorer (where the parameters read turns in context) before labelling.

    .venv/bin/python benchmarks/labelling_cost.py [--items 4] [--samples 4] [--classifier form]
    .venv/bin/python benchmarks/labelling_cost.py --model tiny --items 1 --samples 1 --max-tokens 4

With ``--judge SPEC`` (a local model: llama.cpp, transformers) the same turns are also labelled by
that judge on every turn (scope all), its verdict read from the labels' probabilities, after one
warm-up case that reads the rubric once (as a run's first judged turn does); prints the ratio of
judging time to generation time (target: at most 1).
"""

from __future__ import annotations

import argparse
import time

from userturn.backends import load_backend
from userturn.chat.render import render_user_turn
from userturn.data import load_dataset
from userturn.labels.cascade import labels_of
from userturn.labels.classifier import LearnedClassifier
from userturn.labels.sources import labeller_named
from userturn.records import Case, GenerationParams, Request


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--items", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4,
                        help="turns at T = 1.0 per item, beside its greedy one (the demo: 4)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--classifier", default=None,
                        help="the classifier's parameters: a file, or a shipped set by name "
                        "(context, the default; form, which reads the turn's form alone)")
    parser.add_argument("--judge", default=None,
                        help="also label every turn with this local judge and print its ratio")
    args = parser.parse_args(argv)
    backend = load_backend(args.model, batch_size=8)
    items = load_dataset("gsm_symbolic", limit=args.items).items
    contexts, requests = [], []
    for index, item in enumerate(items):
        answer = str(item.metadata.get("solution") or item.reference)
        prompt = render_user_turn(backend.template,
                                  [*item.messages, {"role": "assistant", "content": answer}])
        for sample, temperature in enumerate([0.0] + [1.0] * args.samples):
            requests.append(Request(prompt.text, GenerationParams(temperature, 1.0,
                                                                  args.max_tokens),
                                    prompt.stop, seed=1000 * index + sample))
            contexts.append((item.query, answer, prompt.assistant_header))
    start = time.perf_counter()
    generations = backend.complete(requests)
    generating = time.perf_counter() - start
    learned = LearnedClassifier(path=args.classifier) if args.classifier else LearnedClassifier()
    learned.read(Case("Warm up.", "Loaded.", "Ready?", "Ready?"))  # loads the scorer
    cascade = labeller_named("cascade").case_labeller(learned=learned)
    cases = [Case(q, a, g.text, g.raw_text, header)
             for (q, a, header), g in zip(contexts, generations)]
    start = time.perf_counter()
    labels = labels_of(cascade, cases)  # the turns the rules leave undecided read together
    labelling = time.perf_counter() - start
    n = len(labels)
    by: dict[str, int] = {}
    for label in labels:
        by[label.source] = by.get(label.source, 0) + 1
    print(f"generation  {n / generating:7.2f} turns/s  ({generating:.1f} s for {n} user turns)")
    print(f"labelling   {n / labelling:7.2f} turns/s  ({labelling:.2f} s; by {by})")
    print(f"labelling / generation time: {labelling / generating:.4f}")
    if args.judge:
        from userturn.labels.judges import judge_from_spec

        judge = judge_from_spec(args.judge)
        judge.classify(Case(items[0].query, "Warm up.", "Ready?", "Ready?"))  # the rubric, once
        start = time.perf_counter()
        verdicts = [judge.classify(case) for case in cases]
        judging = time.perf_counter() - start
        failed = sum(v.error is not None for v in verdicts)
        print(f"judging     {n / judging:7.2f} turns/s  ({judging:.1f} s; {judge.name}, "
              f"{failed} error labels)")
        print(f"judging / generation time: {judging / generating:.4f}")


if __name__ == "__main__":
    main()
