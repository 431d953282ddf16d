"""Table-driven tests of the rule-based classifier against realistic generated user turns.

Every expectation follows docs/labels.md. ``None`` means the rules must stay undecided (the
case is ambiguous, or beyond what rules can judge) and leave it to the LLM judge.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from typing import NamedTuple

import pytest

from userturn.records import LABELS, Case
from userturn.rules import RulesClassifier

CHATML = "<|im_start|>assistant"

# ---- realistic queries and assistant answers ----------------------------------------------------
Q_JANET = (
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes "
    "muffins for her friends every day with four. She sells the remainder at the farmers' market "
    "daily for $2 per fresh duck egg. How much in dollars does she make every day at the farmers' "
    "market?")
A_JANET = (
    "Janet's ducks lay 16 eggs per day. She eats 3 eggs for breakfast and uses 4 eggs for muffins, "
    "so she uses 3 + 4 = 7 eggs.\nThe remaining eggs are 16 - 7 = 9 eggs.\nShe sells each egg for "
    "$2, so she makes 9 * 2 = $18 every day.\n#### 18")
Q_CLIPS = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
    "May. How many clips did Natalia sell altogether in April and May?")
A_CLIPS = (
    "In May, Natalia sold 48 / 2 = 24 clips.\nAltogether she sold 48 + 24 = 72 clips in April and "
    "May.\n#### 72")
A_CLIPS_LOOP = "In May she sold 24 clips. " * 12
Q_WENG = (
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
    "How much did she earn?")
A_WENG = (
    "Weng earns 12 / 60 = $0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $10.\n"
    "#### 10")
Q_LETTERS = (
    "James writes a 3-page letter to 2 different friends twice a week. How many pages does he "
    "write a year?")
A_LETTERS = (
    "He writes each friend 3 * 2 = 6 pages a week.\nSo he writes 6 * 2 = 12 pages every week.\n"
    "That means he writes 12 * 52 = 624 pages a year.\n#### 624")
A_LETTERS_CUT = (  # cut off by max_tokens
    "He writes each friend 3 * 2 = 6 pages a week.\nSo he writes 6 * 2 = 12 pages every week.\n"
    "That means over a whole year he writes")
Q_HAIKU = "Write a haiku about autumn leaves. Do not use any commas."
A_HAIKU = "Crimson leaves drifting\nWhispering to the cold ground\nSummer says goodbye"
Q_FACT = "Write a Python function that returns the factorial of n."
A_FACT = (
    "Here is an iterative version:\n\n```python\ndef factorial(n):\n    result = 1\n    for i in "
    "range(2, n + 1):\n        result *= i\n    return result\n```\n\nWould you like to see a "
    "recursive version as well?")
Q_JAPAN = "I'm planning a trip to Japan in April. Any tips?"
A_JAPAN = (
    "April is cherry blossom season, so book hotels early, especially in Kyoto. Get a Japan Rail "
    "Pass if you plan to travel between cities, carry some cash because many small shops don't "
    "take cards, and visit Ueno Park or Hirosaki Castle for hanami.")
Q_ES = "Juan tiene 5 manzanas y compra 3 más. ¿Cuántas manzanas tiene ahora?"
A_ES = "Juan tenía 5 manzanas y compró 3 más: 5 + 3 = 8. Ahora tiene 8 manzanas."
Q_ZH = "小明有5个苹果，又买了3个。他现在有几个苹果？"
A_ZH = "小明原来有5个苹果，又买了3个，所以一共有5 + 3 = 8个苹果。"


class C(NamedTuple):
    """One case: a name, the conversation, the generated user turn and the expected label."""

    name: str
    query: str
    answer: str
    turn: str
    expected: str | None
    raw: str = ""  # the turn with its special tokens; defaults to the turn itself


CASES = [
    # ---- empty -----------------------------------------------------------------------------------
    C("empty-string", Q_JANET, A_JANET, "", "empty"),
    C("whitespace", Q_CLIPS, A_CLIPS, "  \n\t ", "empty"),
    C("only-im-end", Q_CLIPS, A_CLIPS, "", "empty", raw="<|im_end|>"),
    C("empty-think-block", Q_WENG, A_WENG, "<think>\n\n</think>", "empty",
      raw="<think>\n\n</think><|im_end|>"),
    C("only-eot-id", Q_LETTERS, A_LETTERS, "", "empty", raw="<|eot_id|>"),
    C("deepseek-header-only", Q_CLIPS, A_CLIPS, "", "empty", raw="<｜Assistant｜>"),
    C("dots", Q_CLIPS, A_CLIPS, "......", "empty"),
    C("only-question-mark", Q_WENG, A_WENG, "?", "empty"),
    C("stray-char", Q_JANET, A_JANET, "x", "empty"),
    C("the-the-the", Q_CLIPS, A_CLIPS, "the the the the the the the the", "empty"),
    C("same-line-loop", Q_JAPAN, A_JAPAN, "I love it.\n" * 8, "empty"),
    C("char-loop", Q_HAIKU, A_HAIKU, "hahahahahahahahahahaha", "empty"),
    # labels.md: degenerate repetition that copies the assistant's looping text is empty
    C("copies-assistant-loop", Q_CLIPS, A_CLIPS_LOOP, "In May she sold 24 clips. " * 9, "empty"),
    # ---- assistant_drift -------------------------------------------------------------------------
    C("header-then-text", Q_CLIPS, A_CLIPS, "", "assistant_drift",
      raw="<|im_start|>assistant\nSure! The total is 72 clips."),
    C("gemma-model-header", Q_CLIPS, A_CLIPS, "", "assistant_drift",
      raw="<start_of_turn>model\nNatalia sold 72 clips in total.<end_of_turn>"),
    C("assistant-role-prefix", Q_CLIPS, A_CLIPS, "Assistant: Natalia sold 72 clips altogether.",
      "assistant_drift"),
    C("stripped-header-word", Q_WENG, A_WENG, "assistant\nWeng earned $10 for 50 minutes.",
      "assistant_drift"),
    C("sure-heres", Q_LETTERS, A_LETTERS,
      "Sure! Here's a step-by-step solution: James writes 3 pages to each of 2 friends.",
      "assistant_drift"),
    C("lets-solve", Q_CLIPS, A_CLIPS,
      "Let's solve this step by step. In April Natalia sold 48 clips. In May she sold half as "
      "many.",
      "assistant_drift"),
    C("to-find", Q_JANET, A_JANET,
      "To find out how much Janet makes, we first subtract the eggs she eats and bakes with.",
      "assistant_drift"),
    C("re-solves-gsm8k", Q_JANET, A_JANET,
      "Janet has 16 - 3 - 4 = 9 eggs left. She makes 9 * 2 = $18 a day.\n#### 18",
      "assistant_drift"),
    # labels.md: a coherent copy or continuation of the assistant's solution is assistant_drift
    C("coherent-copy-of-solution", Q_JANET, A_JANET,
      "She eats 3 eggs for breakfast and uses 4 eggs for muffins, so she uses 3 + 4 = 7 eggs. The "
      "remaining eggs are 16 - 7 = 9 eggs.", "assistant_drift"),
    C("copy-of-chitchat-answer", Q_JAPAN, A_JAPAN,
      "Get a Japan Rail Pass if you plan to travel between cities, carry some cash because many "
      "small shops don't take cards.", "assistant_drift"),
    C("hope-this-helps", Q_WENG, A_WENG,
      "I hope this helps! Let me know if you have any other questions.", "assistant_drift"),
    C("youre-welcome", Q_JAPAN, A_JAPAN,
      "You're welcome! If you have any more questions about your trip, feel free to ask.",
      "assistant_drift"),
    C("restate-then-solve", Q_LETTERS, A_LETTERS,
      "James writes a 3-page letter to 2 different friends twice a week. So each week he writes "
      "3 * 2 * 2 = 12 pages. In a year he writes 12 * 52 = 624 pages. The answer is 624.",
      "assistant_drift"),
    C("boxed", Q_WENG, A_WENG, "She earns 12/60 per minute, so 50 minutes give $\\boxed{10}$.",
      "assistant_drift"),
    C("spanish-drift", Q_CLIPS, A_CLIPS,
      "¡Claro! Aquí está la solución: 48 / 2 = 24 y 48 + 24 = 72.\n#### 72", "assistant_drift"),
    # labels.md: starts as the user, but most of the text is the assistant answering
    C("mostly-assistant-after-user-opening", Q_CLIPS, A_CLIPS,
      "Why did you divide by 2? In May she sold 48 / 2 = 24 clips, and in total she sold "
      "48 + 24 = 72 clips in April and May.", "assistant_drift"),
    # ---- meta ------------------------------------------------------------------------------------
    C("user-is-asking", Q_CLIPS, A_CLIPS,
      "The user is asking how many clips Natalia sold in April and May combined.", "meta"),
    C("user-wants", Q_JANET, A_JANET,
      "The user wants to know how much Janet earns each day at the farmers' market.", "meta"),
    C("in-this-conversation", Q_WENG, A_WENG,
      "In this conversation, the assistant correctly calculated Weng's earnings.", "meta"),
    C("possible-user-response", Q_CLIPS, A_CLIPS,
      'Here is a possible user response: "Thanks, that makes sense!"', "meta"),
    C("as-the-user", Q_CLIPS, A_CLIPS,
      "As the user, I would ask why the assistant divided 48 by 2.", "meta"),
    C("user-response-label", Q_CLIPS, A_CLIPS,
      "User response: Can you explain why you divided by 2?", "meta"),
    C("possible-follow-up", Q_CLIPS, A_CLIPS,
      "Possible follow-up: What if Natalia sold twice as many clips in May?", "meta"),
    C("system-prompt", Q_LETTERS, A_LETTERS,
      "You are a helpful assistant. Answer the user's math questions step by step.", "meta"),
    C("reasoning-how-to-respond", Q_WENG, A_WENG,
      "Okay, so the user asked about babysitting pay and got $10. I need to write a follow-up as "
      "the user.", "meta"),
    C("assistants-answer", Q_WENG, A_WENG,
      "The assistant's answer is correct: 50 minutes at $12 an hour is $10.", "meta"),
    # ---- restatement -----------------------------------------------------------------------------
    C("exact-copy", Q_CLIPS, A_CLIPS, Q_CLIPS, "restatement"),
    C("paraphrase-janet", Q_JANET, A_JANET,
      "Janet's ducks lay 16 eggs a day. She eats 3 for breakfast and uses 4 to bake muffins for "
      "her friends. She sells the rest at the farmers' market for $2 each. How much money does "
      "she make every day?", "restatement"),
    C("changed-numbers", Q_WENG, A_WENG,
      "Weng earns $15 an hour for babysitting. Yesterday she did 40 minutes of babysitting. How "
      "much did she earn?", "restatement"),
    C("instruction-again", Q_HAIKU, A_HAIKU,
      "Write a haiku about autumn leaves without using any commas.", "restatement"),
    C("chitchat-again", Q_JAPAN, A_JAPAN,
      "I'm planning a trip to Japan in April, do you have any tips?", "restatement"),
    C("smollm-restates", Q_LETTERS, A_LETTERS,
      "James writes a 3-page letter to 2 different friends twice a week. How many pages does "
      "James write in a year?", "restatement"),
    C("code-task-again", Q_FACT, A_FACT,
      "Write a Python function to return the factorial of n.", "restatement"),
    C("spanish-restates", Q_ES, A_ES, Q_ES, "restatement"),
    # ---- generic ---------------------------------------------------------------------------------
    C("thanks", Q_CLIPS, A_CLIPS, "Thanks!", "generic", raw="Thanks!<|im_end|>"),
    C("thank-you-for-help", Q_JANET, A_JANET, "Great, thank you for the help.", "generic"),
    C("ok", Q_WENG, A_WENG, "Ok.", "generic"),
    C("explain-more", Q_LETTERS, A_LETTERS, "Can you explain more?", "generic"),
    C("got-it", Q_JAPAN, A_JAPAN, "Got it, thanks a lot!", "generic"),
    C("makes-sense", Q_CLIPS, A_CLIPS, "Thank you so much, that makes sense now.", "generic"),
    C("wow-helpful", Q_HAIKU, A_HAIKU, "Wow, that's really helpful. Thanks!", "generic"),
    C("spanish-thanks", Q_ES, A_ES, "¡Muchas gracias!", "generic"),
    C("chinese-thanks", Q_ZH, A_ZH, "谢谢！", "generic"),
    C("thanks-after-offer", Q_FACT, A_FACT, "Thanks! That was helpful.", "generic"),
    # ---- follow_up -------------------------------------------------------------------------------
    # labels.md: gratitude plus a grounded question is follow_up
    C("thanks-but-why-72", Q_CLIPS, A_CLIPS, "Thanks! But why 72?", "follow_up"),
    C("why-divide", Q_CLIPS, A_CLIPS, "Why did you divide 48 by 2?", "follow_up"),
    C("dispute-total", Q_JANET, A_JANET,
      "Your total is 18 but I think it should be 20 because she also sells the muffins.",
      "follow_up"),
    # labels.md: after a cut-off answer, asking for the missing part is follow_up
    C("cut-off-finish", Q_LETTERS, A_LETTERS_CUT, "It stopped mid-sentence, can you finish?",
      "follow_up"),
    C("cut-off-next-step", Q_LETTERS, A_LETTERS_CUT, "Please continue with the next step.",
      "follow_up"),
    C("yes-recursive", Q_FACT, A_FACT, "Yes, please show the recursive version.", "follow_up"),
    C("how-did-you-get", Q_WENG, A_WENG, "How did you get 0.2 per minute?", "follow_up"),
    C("where-second-2", Q_LETTERS, A_LETTERS,
      "In the second step you multiplied 6 by 2. Where does that 2 come from?", "follow_up"),
    C("rail-pass", Q_JAPAN, A_JAPAN,
      "Is the Japan Rail Pass worth it if I'm only visiting Tokyo and Kyoto?", "follow_up"),
    C("haiku-line", Q_HAIKU, A_HAIKU,
      "Why did you end with 'Summer says goodbye' when the poem is about autumn?", "follow_up"),
    # labels.md: non-English text follows the same rules
    C("spanish-why-8", Q_ES, A_ES, "¿Por qué el resultado es 8?", "follow_up"),
    C("chinese-why-8", Q_ZH, A_ZH, "为什么是8个？", "follow_up"),
    C("german-why-divide", Q_CLIPS, A_CLIPS, "Danke! Warum hast du durch 2 geteilt?", "follow_up"),
    # ---- new_query -------------------------------------------------------------------------------
    C("capital-of-france", Q_CLIPS, A_CLIPS, "What is the capital of France?", "new_query"),
    C("new-word-problem", Q_CLIPS, A_CLIPS,
      "A baker makes 45 loaves of bread each morning and sells 38 of them. How many loaves are "
      "left at the end of the day?", "new_query"),
    C("poem-about-sea", Q_CLIPS, A_CLIPS, "Write a poem about the sea.", "new_query"),
    C("flat-tire", Q_JANET, A_JANET, "How do I change a flat tire on my bike?", "new_query"),
    C("marbles", Q_WENG, A_WENG,
      "Tom has 7 red marbles and 14 blue marbles. He gives 5 to his sister. How many marbles does "
      "he have now?", "new_query"),
    C("book-recommendation", Q_JAPAN, A_JAPAN,  # "book" (hotels) is a homonym, not shared content
      "Can you recommend a good book about World War II?", "new_query"),
    C("translate", Q_HAIKU, A_HAIKU, "Translate 'good morning' into German.", "new_query"),
    C("sum-of-two-numbers", Q_LETTERS, A_LETTERS, "What is the sum of 125 and 378?", "new_query"),
    C("spanish-new-question", Q_ES, A_ES, "¿Cuál es la capital de Francia?", "new_query"),
    # ---- undecided: ambiguous, or beyond what rules can judge ------------------------------------
    C("explain-second-step", Q_CLIPS, A_CLIPS, "Can you explain the second step?", None),
    C("what-if-variation", Q_CLIPS, A_CLIPS,
      "What if Natalia sold twice as many clips in May instead?", None),
    C("user-summarises", Q_CLIPS, A_CLIPS,
      "Thanks, that makes sense. So in May she sold 24 clips.", None),
    C("role-labelled-script", Q_CLIPS, A_CLIPS, "User: Why did you divide by 2?", None),
    C("emoji-only", Q_JAPAN, A_JAPAN, "👍", None),
    C("yes-to-offer", Q_FACT, A_FACT, "Yes.", None),  # may answer the assistant's question
    C("word-salad", Q_CLIPS, A_CLIPS,  # empty per labels.md, but rules cannot tell it from prose
      "Purple elephants negotiate quietly beneath the recursive staircase of Tuesday.", None),
    C("same-for-five", Q_LETTERS, A_LETTERS, "Can you do the same for 5 friends?", None),
    C("this-function-after-offer", Q_FACT, A_FACT,
      "What is the time complexity of this function?", None),
    C("restatement-plus-short-answer", Q_JANET, A_JANET,
      "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes "
      "muffins for her friends every day with four. How much does she make? #### 18", None),
    C("continue-after-complete-answer", Q_CLIPS, A_CLIPS, "Please continue.", None),
    C("question-then-degenerates", Q_CLIPS, A_CLIPS,
      "What is the capital of France? " + "France " * 30, None),
    C("request-then-copies-loop", Q_CLIPS, A_CLIPS_LOOP,
      "Make it shorter.\n" + "In May she sold 24 clips. " * 8, None),
    C("echoes-result-number", Q_CLIPS, A_CLIPS, "72", None),
    C("states-the-answer", Q_CLIPS, A_CLIPS, "The answer is 72.", None),
]


def _case(c: C, header: str = CHATML) -> Case:
    return Case(c.query, c.answer, c.turn, c.raw or c.turn, header)


@pytest.fixture(scope="module")
def classifier() -> RulesClassifier:
    return RulesClassifier()


@pytest.mark.parametrize("c", [pytest.param(c, id=c.name) for c in CASES])
def test_label(classifier: RulesClassifier, c: C) -> None:
    label = classifier.classify(_case(c))
    assert label.label == c.expected, label.rationale
    assert label.source == "rules"
    assert label.rationale.strip()
    assert label.error is None
    assert label.rationale.startswith("undecided") == (c.expected is None)


def test_cases_cover_every_label() -> None:
    counts = Counter(c.expected for c in CASES)
    assert all(counts[name] >= 6 for name in LABELS), counts
    assert counts[None] >= 8 and sum(counts.values()) - counts[None] >= 45


# How the pipeline ends a user turn: the raw text runs up to and including the first stop marker,
# the template's end-of-turn or its assistant header (the only marker for deepseek, glm4, [INST]).
HEADER_CASES = [
    ("chatml-end-of-turn", "Why 72?<|im_end|>", "<|im_start|>assistant", "follow_up"),
    ("mistral-terminator", "Why 72? [/INST]", "[/INST]", "follow_up"),
    ("glm4-terminator", "Thanks!<|assistant|>", "<|assistant|>", "generic"),
    ("deepseek-terminator", "Thanks! But why 72?<｜Assistant｜>", "<｜Assistant｜>", "follow_up"),
    ("chatml-header-ends-user-text", "Why 72?<|im_start|>assistant", "<|im_start|>assistant",
     "follow_up"),
    ("llama3-header-then-speech",
     "<|start_header_id|>assistant<|end_header_id|>\n\nNatalia sold 72 clips.",
     "<|start_header_id|>assistant<|end_header_id|>", "assistant_drift"),
    ("chatml-header-then-speech", "Hmm.<|im_start|>assistant\nIn May she sold 24 clips, so 72.",
     "<|im_start|>assistant", "assistant_drift"),
    ("header-unknown-to-case", "<|im_start|>assistant\nSure, the total is 72.", "",
     "assistant_drift"),
]


@pytest.mark.parametrize("raw, header, expected",
                         [pytest.param(*h[1:], id=h[0]) for h in HEADER_CASES])
def test_assistant_header(raw: str, header: str, expected: str) -> None:
    visible = raw
    for marker in ("<|im_end|>", "[/INST]", "<|assistant|>", "<｜Assistant｜>", CHATML):
        visible = visible.split(marker)[0]
    label = RulesClassifier().classify(Case(Q_CLIPS, A_CLIPS, visible.strip(), raw, header))
    assert (label.label, label.source) == (expected, "rules"), label.rationale


def test_interface() -> None:
    assert RulesClassifier.name == "rules"
    assert RulesClassifier.version


ODD_TURNS = [
    "word " * 20000,
    "Why did you divide by 2? " * 3000,
    "a" * 50000 + "!",
    "🙂🙃" * 500 + "\u200b\u202e مرحبا بك שלום",
    "e\u0301\u0301\u0301 ñ \x00 \x1b[31m",
    "<|im_start|><|im_end|><|eot_id|></s><s><think></think>[INST][/INST]<<SYS>>",
    "#### " + "9" * 5000,
    "(" * 3000 + ")" * 3000,
    "1 + 1 = 2\n" * 2000,
    " + ".join(str(i) for i in range(20000)),  # took minutes with a backtracking equation regex
    "Why? " + " ".join(f"{i}x{i + 1}" for i in range(10000)),
]


@pytest.mark.parametrize("text", ODD_TURNS, ids=range(len(ODD_TURNS)))
def test_odd_input_never_raises(classifier: RulesClassifier, text: str) -> None:
    case = Case(Q_CLIPS, A_CLIPS, text, text + "<|im_end|>", CHATML)
    started = time.perf_counter()
    label = classifier.classify(case)
    assert time.perf_counter() - started < 5.0
    assert label == RulesClassifier().classify(case)
    assert label.source == "rules" and label.rationale and label.error is None
    assert label.label is None or label.label in LABELS


def test_odd_query_and_answer(classifier: RulesClassifier) -> None:
    for query, answer in [("", ""), ("?", "\x00"), ("💥" * 1000, "<|im_end|>" * 100)]:
        label = classifier.classify(Case(query, answer, "Thanks! But why 72?", "", ""))
        assert label.source == "rules" and label.rationale and label.error is None


_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from test_rules import CASES, _case
from userturn.rules import RulesClassifier
print(json.dumps([list(RulesClassifier().classify(_case(c)).__dict__.values()) for c in CASES]))
"""


def test_deterministic_across_processes(classifier: RulesClassifier) -> None:
    """Same labels and rationales under different string-hash seeds (no set-order leaks)."""
    here = os.path.dirname(os.path.abspath(__file__))
    runs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", _SCRIPT, here], env=env, check=True,
                             capture_output=True, text=True).stdout
        runs.append(json.loads(out))
    expected = [list(classifier.classify(_case(c)).__dict__.values()) for c in CASES]
    assert runs[0] == runs[1] == expected
