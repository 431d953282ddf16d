"""The probe prompt on the prompt formats of templates that model authors publish.

Each fixture in tests/fixtures/templates/published/ keeps only the format of one family's
published chat template (its header comment names where it came from; tools, media and long
default system texts are left out). For each family the table below holds what a reader checks by
eye against that format: how the probe prompt ends (the closed answer and the opened user turn),
where a generated user turn stops, the assistant header, how the ordinary assistant prompt ends,
where an assistant turn stops and what happened to the system message. The whole prompt text is
compared with a golden file as well (tests/golden/published/<family>.txt; regenerate with
``UPDATE_GOLDEN=1`` and read the diff).

The first five families are the ones whose markers used to be cut at characters, or whose system
message was placed where the template never puts it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import PUBLISHED, load_family, load_published

from userturn.chat.render import (
    SYSTEM_KEPT,
    SYSTEM_MERGED_BY_TEMPLATE,
    SYSTEM_MOVED,
    ChatTemplate,
    derive_markers,
    render_assistant_turn,
    render_user_turn,
)
from userturn.errors import TemplateError

HERE = Path(__file__).parent
GOLDEN = HERE / "golden" / "published"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"

SYSTEM = "You are a careful math tutor."
QUERY = "Natalia sold 48 clips in April and half as many in May. How many in all?"
ANSWER = "<think>\nHalf of 48 is 24.\n</think>\n\nShe sold 48 + 24 = 72 clips. The answer is 72."
VISIBLE_END = "The answer is 72."
DSEOS = "<｜end▁of▁sentence｜>"


@dataclass(frozen=True)
class Family:
    """What a reader checks by eye (the template's file and special tokens: helpers.PUBLISHED)."""

    tail: str  # what follows the visible answer: the closed turn, then the opened user turn
    user_stop: tuple[str, ...]
    header: str  # the assistant header, as derived
    assistant_prompt_end: str
    assistant_stop: str
    system: str = SYSTEM_KEPT
    thinks: bool = True  # the template drops a reasoning model's thinking from history


FAMILIES = {
    # Generation prompt "<｜Assistant｜></think>": the thinking tag is no part of the stop.
    "deepseek_v31": Family(f"{DSEOS}<｜User｜>", ("<｜Assistant｜>",), "<｜Assistant｜>",
                           "<｜Assistant｜></think>", DSEOS),
    # "<|assistant|></think>" in history, "<|assistant|><think>" when generating: the stop is the
    # whole role token, never "<|assistant|><".
    "glm47_flash": Family("<|user|>", ("<|assistant|>",), "<|assistant|>", "<|assistant|><think>",
                          "<|user|>"),
    # Plain-text role name after the special token: the turn ends at <SPECIAL_11>.
    "nemotron_nano_v2": Family("\n<SPECIAL_12>\n\n<SPECIAL_11>User\n",
                               ("<SPECIAL_11>", "<SPECIAL_11>Assistant"),
                               "<SPECIAL_11>Assistant\n", "<SPECIAL_11>Assistant\n<think>\n\n",
                               "<SPECIAL_12>"),
    # The assistant header after every user message: no "<｜" stop, no "Assistant｜>" header.
    "deepseek_r1_0528": Family(f"{DSEOS}<｜User｜>", ("<｜Assistant｜>",), "<｜Assistant｜>",
                               "<｜Assistant｜>", DSEOS),
    # The system text goes into the last user message: here the query the model answered.
    "mistral_nemo": Family("</s>[INST]", ("[/INST]",), "[/INST]", "[/INST]", "</s>", SYSTEM_MOVED,
                           thinks=False),
    "llama4": Family("<|eot|><|header_start|>user<|header_end|>\n\n", ("<|eot|>",
                     "<|header_start|>assistant<|header_end|>"),
                     "<|header_start|>assistant<|header_end|>\n\n",
                     "<|header_start|>assistant<|header_end|>\n\n", "<|eot|>", thinks=False),
    "mistral_small3": Family("</s>[INST]", ("[/INST]",), "[/INST]", "[/INST]", "</s>",
                             thinks=False),
    "ministral_reasoning": Family("</s>[INST]", ("[/INST]",), "[/INST]", "[/INST]", "</s>"),
    "gemma4": Family("<turn|>\n<|turn>user\n", ("<turn|>", "<|turn>model"), "<|turn>model\n",
                     "<|turn>model\n<|channel>thought\n<channel|>", "<turn|>", thinks=False),
    "glm45": Family("<|user|>\n", ("<|assistant|>",), "<|assistant|>", "<|assistant|>",
                    "<|user|>"),
    "qwen3_coder": Family("<|im_end|>\n<|im_start|>user\n",
                          ("<|im_end|>", "<|im_start|>assistant"), "<|im_start|>assistant\n",
                          "<|im_start|>assistant\n", "<|im_end|>", thinks=False),
    "kimi_k2_thinking": Family("<|im_end|><|im_user|>user<|im_middle|>",
                               ("<|im_end|>", "<|im_assistant|>assistant<|im_middle|>"),
                               "<|im_assistant|>assistant<|im_middle|>",
                               "<|im_assistant|>assistant<|im_middle|>", "<|im_end|>",
                               thinks=False),
    "minimax_m2": Family("[e~[\n]~b]user\n", ("[e~[", "]~b]ai"),
                         "]~b]ai\n", "]~b]ai\n<think>\n", "[e~["),
    "seed_oss": Family("<seed:eos><seed:bos>user\n",
                       ("<seed:eos>", "<seed:bos>assistant"), "<seed:bos>assistant\n",
                       "<seed:bos>assistant\n", "<seed:eos>", thinks=False),
    "apertus": Family("<|assistant_end|><|user_start|>", ("<|user_end|>", "<|assistant_start|>"),
                      "<|assistant_start|>", "<|assistant_start|>", "<|assistant_end|>",
                      thinks=False),
    "lfm2": Family("<|im_end|>\n<|im_start|>user\n", ("<|im_end|>", "<|im_start|>assistant"),
                   "<|im_start|>assistant\n", "<|im_start|>assistant\n", "<|im_end|>",
                   thinks=False),
    "granite4": Family("<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>",
                       ("<|end_of_text|>", "<|start_of_role|>assistant<|end_of_role|>"),
                       "<|start_of_role|>assistant<|end_of_role|>",
                       "<|start_of_role|>assistant<|end_of_role|>", "<|end_of_text|>",
                       thinks=False),
    "phi4_reasoning": Family("<|im_end|><|im_start|>user<|im_sep|>",
                             ("<|im_end|>", "<|im_start|>assistant<|im_sep|>"),
                             "<|im_start|>assistant<|im_sep|>", "<|im_start|>assistant<|im_sep|>",
                             "<|im_end|>"),
    # History wraps an answer in <|START_RESPONSE|>...; the header is the two role tokens.
    "command_a": Family("<|END_RESPONSE|><|END_OF_TURN_TOKEN|>"
                        "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>",
                        ("<|END_OF_TURN_TOKEN|>", "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
                        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
                        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
                        "<|END_RESPONSE|>", thinks=False),
    # A user message ends with a newline only: the stop is the assistant role token.
    "exaone": Family("[|endofturn|]\n[|user|]", ("[|assistant|]",), "[|assistant|]",
                     "[|assistant|]", "[|endofturn|]", thinks=False),
}


def load(name: str) -> ChatTemplate:
    return load_published(name)


def conversation(name: str = "") -> list[dict[str, str]]:
    """The probed conversation; a thinking model's answer carries its thinking."""
    answer = ANSWER if name and FAMILIES[name].thinks else ANSWER.split("</think>\n\n")[1]
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUERY},
            {"role": "assistant", "content": answer}]


NAMES = list(FAMILIES)


def test_every_published_fixture_has_its_tokens_and_expectations():
    files = {path.name for path in (HERE / "fixtures" / "templates" / "published").glob("*.jinja")}
    assert set(FAMILIES) == set(PUBLISHED)
    assert {spec["file"] for spec in PUBLISHED.values()} == files


@pytest.mark.parametrize("name", NAMES)
def test_the_probe_closes_the_answer_and_opens_a_user_turn(name):
    prompt = render_user_turn(load(name), conversation(name))
    assert prompt.text.endswith(VISIBLE_END + FAMILIES[name].tail)
    assert "Half of 48" not in prompt.text  # thinking models: the template drops it


@pytest.mark.parametrize("name", NAMES)
def test_user_turn_stops_header_and_assistant_turn(name):
    family, template = FAMILIES[name], load(name)
    prompt = render_user_turn(template, conversation(name))
    assert prompt.stop == family.user_stop
    assert prompt.assistant_header == family.header
    answer = render_assistant_turn(template, conversation(name)[:2])
    assert answer.text.endswith(family.assistant_prompt_end)
    assert answer.stop == (family.assistant_stop,)


@pytest.mark.parametrize("name", NAMES)
def test_what_happened_to_the_system_message(name):
    prompt = render_user_turn(load(name), conversation(name))
    assert prompt.system == FAMILIES[name].system
    assert prompt.text.count(SYSTEM) == 1
    assert prompt.text.index(SYSTEM) < prompt.text.index(QUERY)


@pytest.mark.parametrize("name", NAMES)
def test_golden_prompt(name):
    actual = render_user_turn(load(name), conversation(name)).text
    path = GOLDEN / f"{name}.txt"
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8", newline="") as f:
            f.write(actual)
        pytest.skip(f"wrote {path.relative_to(HERE)}; read it before committing")
    with path.open(encoding="utf-8", newline="") as f:
        assert actual == f.read()


@pytest.mark.parametrize("name", NAMES)
def test_no_stop_ends_inside_a_special_token_of_the_prompt(name):
    # Every stop is whole pieces of the template's own markers: where it is found in a rendered
    # conversation, it starts and ends at the boundary of a special token or of plain text.
    template = load(name)
    lexer = template.lexer
    tokens = {piece for piece, special in lexer.pieces(render_user_turn(
        template, conversation(name)).text) if special}
    for stop in render_user_turn(template, conversation(name)).stop:
        pieces = lexer.pieces(stop)
        assert pieces[0][1], f"{stop!r} does not start with a special token"
        assert all(piece in tokens or not special for piece, special in pieces)


def test_mistral_nemo_puts_the_system_text_in_the_query_the_model_answered():
    # Two user turns: the template wrote the system text into the SECOND query when the model
    # answered it, so the probe renders it there, not in the first and not in the opened turn.
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": QUERY},
                {"role": "assistant", "content": "72."}]
    template = load("mistral_nemo")
    answered = render_assistant_turn(template, messages[:-1]).text
    assert answered == f"<s>[INST]Hi[/INST]Hello!</s>[INST]{SYSTEM}\n\n{QUERY}[/INST]"
    prompt = render_user_turn(template, messages)
    assert prompt.text == answered + "72.</s>[INST]"
    assert prompt.system == SYSTEM_MOVED and prompt.system_merged


def test_gemma3_merges_the_system_text_itself():
    # The existing gemma3 fixture: the template writes the system text into the first user turn.

    prompt = render_user_turn(load_family("gemma3"), conversation())
    assert prompt.system == SYSTEM_MERGED_BY_TEMPLATE and not prompt.system_merged


def test_a_template_that_drops_the_system_text_says_so():
    source = ("{% for m in messages if m['role'] != 'system' %}<|im_start|>{{ m['role'] }}\n"
              "{{ m['content'] }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    prompt = render_user_turn(ChatTemplate(source, "drops"), conversation())
    assert SYSTEM not in prompt.text
    assert prompt.system.startswith("dropped by the template")


def test_the_old_character_cut_would_have_been_refused():
    # A stop that ends inside a known token is refused loudly, naming the model and the token.
    from userturn.chat.template_tokens import TokenLexer

    lexer = TokenLexer(["<|assistant|>", "<think>"])
    assert lexer.ends_inside_token("<|assistant|><") == "<think>"
    assert lexer.ends_inside_token("<|assistant|>") is None
    assert lexer.common_prefix("<|assistant|></think>", "<|assistant|><think>") == "<|assistant|>"
    source = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
              "{% if add_generation_prompt %}<|assistant|><{% endif %}")
    template = ChatTemplate(source, "cut", special_tokens=("<|assistant|>", "<|user|>", "<think>"))
    # The generation prompt's stray "<" is plain text after the role token, so the header is the
    # token alone, and the stop with it.
    assert derive_markers(template).user_stop == ("<|assistant|>",)


def test_the_tokenizer_s_own_tokens_decide_the_boundaries():
    # A role token of a shape no template writes by convention: known only from the tokenizer.
    source = ("{% for m in messages %}@@{{ m['role'] }}@@ {{ m['content'] }}{% endfor %}"
              "{% if add_generation_prompt %}@@assistant@@ {% endif %}")
    plain = ChatTemplate(source, "odd")
    told = ChatTemplate(source, "odd", special_tokens=("@@assistant@@", "@@user@@"))
    assert derive_markers(plain).user_stop == ("@@assistant@@",)  # the header, stripped
    assert derive_markers(told).user_end_marker == "@@assistant@@"


def test_a_stop_cut_inside_a_token_is_refused_naming_the_model():
    from userturn.chat.render import check_whole_tokens
    from userturn.chat.template_tokens import TokenLexer

    with pytest.raises(TemplateError, match="chat template of m: .*'<think>'"):
        check_whole_tokens("m", TokenLexer(["<think>"]), ("<|assistant|><",))
