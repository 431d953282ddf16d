"""The user turn's opening as a factor, and `userturn render --template FILE`.

Runs on the tiny real model (its ChatML template) and the real SQLite store: a run with two
user-turn variants stores each as its own condition, answers once, and reports both rates with the
paired difference against native.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from userturn.chat.render import SYSTEM_MOVED, ChatTemplate
from userturn.cli.main import main
from userturn.config import Experiment, load_experiment
from userturn.errors import ConfigError
from userturn.probe.pipeline import run_experiment
from userturn.probe.user_variants import WARMUP, parse_user_variant, user_turn_prompt
from userturn.stats.variants import variant_comparisons
from userturn.store.turns import read_answers, read_turns

HERE = Path(__file__).parent
PUBLISHED = HERE / "fixtures" / "templates" / "published"
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "4."}]
NATIVE_TAIL = "4.<|im_end|>\n<|im_start|>user\n"


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ------------------------------------------------------------------ the prompts


def test_each_variant_changes_only_the_user_turn_prompt():
    template = ChatTemplate(CHATML, "chatml")
    native = user_turn_prompt(template, MESSAGES)
    assert native.text.endswith(NATIVE_TAIL)

    prefill = user_turn_prompt(template, MESSAGES, parse_user_variant("prefill:Thanks, but"))
    assert prefill.text == native.text + "Thanks, but" and prefill.stop == native.stop

    none = user_turn_prompt(template, MESSAGES, parse_user_variant("system:none"))
    assert none.text.startswith("<|im_start|>system\n<|im_end|>\n") and "Be brief." not in none.text
    default = user_turn_prompt(template, MESSAGES, parse_user_variant("system:default"))
    assert default.text.startswith("<|im_start|>user\nWhat is 2 + 2?")
    other = user_turn_prompt(template, MESSAGES, parse_user_variant("system:Talk like a pirate."))
    assert other.text.startswith("<|im_start|>system\nTalk like a pirate.<|im_end|>")

    warm = user_turn_prompt(template, MESSAGES, parse_user_variant("warmup:2"))
    expected = "".join(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n"
                       for q, a in WARMUP[:2])
    assert warm.text == ("<|im_start|>system\nBe brief.<|im_end|>\n" + expected
                         + native.text[len("<|im_start|>system\nBe brief.<|im_end|>\n"):])


def test_a_template_whose_generation_prompt_opens_the_user_header(tmp_path):
    # A speaker name in the user header, opened by the override's generation prompt.
    override = tmp_path / "speaker.jinja"
    override.write_text(CHATML.replace("<|im_start|>assistant\n{% endif %}",
                                       "<|im_start|>user name=Alex\n{% endif %}"))
    variant = parse_user_variant(f"template:{override}")
    from userturn.chat.template_file import load_template_file

    prompt = user_turn_prompt(ChatTemplate(CHATML, "chatml"), MESSAGES, variant,
                              override=load_template_file(override))
    assert prompt.text.endswith("4.<|im_end|>\n<|im_start|>user name=Alex\n")
    assert prompt.stop == ("<|im_end|>", "<|im_start|>assistant")  # the model's own stops


@pytest.mark.parametrize("bad, words", [
    ("prefix:x", "unknown user-turn variant"), ("prefill:", "needs a value"),
    ("warmup:0", "K from 1 to"), ("warmup:many", "K from 1 to"), ("native:x", "takes no value"),
    ("template:/no/such.jinja", "file not found")])
def test_bad_variants_are_config_errors(bad, words):
    with pytest.raises(ConfigError, match=words):
        load_experiment(None, {"user_turn_variants": [bad]})


def test_a_variant_listed_twice_is_refused():
    with pytest.raises(ConfigError, match="twice"):
        Experiment.model_validate({"user_turn_variants": ["native", "warmup:1", "warmup:01"]})


# ------------------------------------------------------------------ a run on the tiny model


def test_a_run_with_two_variants_reports_both_rates_and_the_paired_difference(
        tmp_path, tiny_backend, capsys):
    exp = Experiment(models=["tiny"], datasets=["gsm_symbolic"], limit=3, temperatures=[0.0],
                     max_tokens=8, user_max_tokens=8, output=tmp_path / "run",
                     user_turn_variants=["prefill:Thanks", "warmup:1"])
    store = run_experiment(exp, backends={"tiny": tiny_backend})
    turns = read_turns(store)
    # The variant is a typed field of the turn; the model is the model's own spec.
    assert {(t.model, t.user_variant, t.enable_thinking) for t in turns if t.model != "human"} \
        == {("tiny", "native", "default"), ("tiny", "prefill:Thanks", "default"),
            ("tiny", "warmup:1", "default")}
    assert {t.probed for t in turns} - {"human"} == {
        "tiny", "tiny[user=prefill:Thanks]", "tiny[user=warmup:1]"}
    # The plan table stores the model's spec and the variant in its own column.
    planned = store.db.execute("SELECT DISTINCT model, user_variant, enable_thinking FROM plan "
                               "WHERE role = 'user' AND model != 'human'").fetchall()
    assert sorted(tuple(r) for r in planned) == [
        ("tiny", "native", "default"), ("tiny", "prefill:Thanks", "default"),
        ("tiny", "warmup:1", "default")]
    # One set of answers, shared: native and both variants are probed on the same answers.
    answers = read_answers(store)
    assert {a.model for a in answers} == {"tiny"} and len(answers) == 3
    keys = {t.key for t in turns}
    assert len(keys) == len(turns) == 9  # each condition its own generation key
    meta = store.meta().models
    assert meta["tiny[user=prefill:Thanks]"].user_turn_variant == "prefill:Thanks"
    assert meta["tiny[user=warmup:1]"].base_model == "tiny"
    assert meta["tiny"].system_message == "none"

    comparisons = variant_comparisons(turns)
    assert [(c.native, c.variant) for c in comparisons] == [
        ("tiny", "prefill:Thanks"), ("tiny", "warmup:1")]
    for c in comparisons:
        assert c.follow_up.items == 3
        native = [t for t in turns if t.model == "tiny" and t.user_variant == "native"]
        assert c.follow_up.a.hits == sum(t.follow_up for t in native)
    store.close()

    code, out, _ = run_cli(capsys, "report", str(tmp_path / "run"))
    assert code == 0
    assert "User-turn variants vs native" in out and "prefill:Thanks" in out and "warmup:1" in out
    # Each variant's own row in the rate table, its name shown whole (not read as rich markup).
    assert "tiny[user=prefill:Thanks]" in out and "tiny[user=warmup:1]" in out
    # The HTML report and its tables pair each variant with native too.
    code, _, _ = run_cli(capsys, "report", str(tmp_path / "run"), "--html")
    assert code == 0
    page = (tmp_path / "run" / "report.html").read_text(encoding="utf-8")
    assert '<section id="user-variants">' in page and 'href="#user-variants"' in page
    assert "<code>prefill:Thanks</code>" in page and "<code>warmup:1</code>" in page
    table = list(csv.DictReader((tmp_path / "run" / "report_tables" / "user_turn_variants.csv")
                                .open(encoding="utf-8")))
    assert [(r["model"], r["variant"], r["items"]) for r in table] == [
        ("tiny", "prefill:Thanks", "3"), ("tiny", "warmup:1", "3")]
    native_hits = sum(t.follow_up for t in turns if t.model == "tiny"
                      and t.user_variant == "native")
    assert all(int(r["native_follow_up_hits"]) == native_hits for r in table)
    # summary.csv: the model's spec, the variant in its own field beside the arm.
    summary = list(csv.DictReader((tmp_path / "run" / "report_tables" / "summary.csv")
                                  .open(encoding="utf-8")))
    assert list(summary[0])[:4] == ["model", "arm", "user_variant", "enable_thinking"]
    assert [(r["model"], r["user_variant"]) for r in summary if r["model"] != "human"] == [
        ("tiny", "native"), ("tiny", "prefill:Thanks"), ("tiny", "warmup:1")]


def test_the_prefill_is_in_the_prompt_not_in_the_stored_turn(tmp_path, tiny_backend):
    exp = Experiment(models=["tiny"], datasets=["gsm_symbolic"], limit=1, temperatures=[0.0],
                     max_tokens=4, user_max_tokens=4, output=tmp_path / "run",
                     user_turn_variants=["prefill:QQQZZZ"])
    store = run_experiment(exp, backends={"tiny": tiny_backend})
    rows = store.db.execute("SELECT p.model, p.user_variant, g.prompt, g.raw_text FROM "
                            "generations g JOIN plan p ON p.key = g.key WHERE g.role='user'"
                            ).fetchall()
    by_variant = {(r["model"], r["user_variant"]): r for r in rows}
    assert by_variant[("tiny", "prefill:QQQZZZ")]["prompt"].endswith("<|im_start|>user\nQQQZZZ")
    assert "QQQZZZ" not in by_variant[("tiny", "prefill:QQQZZZ")]["raw_text"]
    store.close()


# ------------------------------------------------------------------ render --template


def test_render_a_jinja_file_without_a_model(capsys):
    code, out, _ = run_cli(capsys, "render", "--template", str(PUBLISHED / "mistral_nemo.jinja"),
                           "--bos", "<s>", "--eos", "</s>", "--system", "Be brief.")
    assert code == 0
    assert f"system message: {SYSTEM_MOVED}" in out
    assert "<s>[INST]Be brief.\n\nA baker" in out and "#### 7</s>[INST]\n----- end" in out
    assert "stop markers (end of the user turn): ['[/INST]']" in out


def test_render_a_tokenizer_config_json(capsys, tmp_path):
    config = {"chat_template": (PUBLISHED / "nemotron_nano_v2.jinja").read_text(),
              "bos_token": {"content": "<s>"}, "eos_token": "<SPECIAL_12>",
              "added_tokens_decoder": {"10": {"content": "<SPECIAL_10>", "special": True},
                                       "11": {"content": "<SPECIAL_11>", "special": True},
                                       "12": {"content": "<SPECIAL_12>", "special": True}}}
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps(config))
    code, out, _ = run_cli(capsys, "render", "--template", str(path), "--variant", "prefill:So")
    assert code == 0
    assert "<SPECIAL_11>User\nSo\n----- end of prompt" in out
    assert "['<SPECIAL_11>', '<SPECIAL_11>Assistant']" in out
    assert "user-turn variant: prefill:So" in out


@pytest.mark.parametrize("args, words", [
    (["--template", "/no/such/file.jinja"], "template file not found"),
    (["--template", "BAD_JSON"], "is not valid JSON"),
    (["--template", "NO_TEMPLATE"], "has no chat_template"),
    (["--model", "tiny", "--bos", "<s>"], "--bos and --eos are for --template"),
    (["--template", "GOOD", "--variant", "warmup:99"], "K from 1 to"),
])
def test_render_misuse_is_one_line(capsys, tmp_path, args, words):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "none.json").write_text(json.dumps({"bos_token": "<s>"}))
    (tmp_path / "good.jinja").write_text(CHATML)
    swap = {"BAD_JSON": str(tmp_path / "bad.json"), "NO_TEMPLATE": str(tmp_path / "none.json"),
            "GOOD": str(tmp_path / "good.jinja")}
    code, out, err = run_cli(capsys, "render", *[swap.get(a, a) for a in args])
    assert code == 2 and out == ""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], err
