"""llama.cpp backend: GGUF specs and their embedded template (always), and, where llama-cpp-python
is installed, the prompt tokens and turns it produces on the SmolLM2 GGUF."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import QUESTIONS

from userturn.backends import load_backend, load_template
from userturn.backends.models import resolve_model, smollm2_gguf
from userturn.chat.render import prompt_token_ids, render_user_turn
from userturn.errors import ModelError
from userturn.records import GenerationParams, Request

HAS_LLAMA = importlib.util.find_spec("llama_cpp") is not None
needs_llama = pytest.mark.skipif(not HAS_LLAMA, reason="llama-cpp-python is not installed "
                                                       "(pip install 'userturn[llamacpp]')")


def test_gguf_specs_resolve_to_a_file_with_a_fingerprint(tmp_path) -> None:
    ref = resolve_model("llamacpp/smollm2")
    assert (ref.backend, ref.path) == ("llamacpp", str(smollm2_gguf().resolve()))
    assert ref.revision.startswith("sha256:")
    copy = tmp_path / "model.gguf"
    copy.write_bytes(b"GGUF" + b"\0" * 64)
    other = resolve_model(f"llamacpp/{copy}")
    assert other.path == str(copy) and other.revision != ref.revision
    for bad in ("llamacpp/tiny", f"llamacpp/{tmp_path}", "llamacpp/./missing.gguf"):
        with pytest.raises(ModelError, match="GGUF file"):
            resolve_model(bad)


def test_the_gguf_template_is_the_one_transformers_reads_from_it() -> None:
    pytest.importorskip("gguf", reason="pip install gguf")
    ours, theirs = load_template("llamacpp/smollm2"), load_template("smollm2")
    assert (ours.source, ours.bos_token, ours.eos_token) == \
        (theirs.source, theirs.bos_token, theirs.eos_token)
    assert ours.model == "llamacpp/smollm2"


def test_engine_arguments_from_the_environment_must_be_a_json_object(monkeypatch) -> None:
    monkeypatch.setenv("USERTURN_LLAMACPP_ARGS", "n_ctx=512")
    with pytest.raises(ModelError, match="USERTURN_LLAMACPP_ARGS must be a JSON object"):
        load_backend("llamacpp/smollm2")
    monkeypatch.setenv("USERTURN_LLAMACPP_ARGS", "[512]")
    with pytest.raises(ModelError, match="JSON object, not list"):
        load_backend("llamacpp/smollm2")


@pytest.fixture(scope="module")
def llama():
    if not HAS_LLAMA:
        pytest.skip("llama-cpp-python is not installed")
    return load_backend("llamacpp/smollm2", backend_args={"n_ctx": 2048})


def prompts(backend):
    return [render_user_turn(backend.template, [{"role": "user", "content": q},
                                                {"role": "assistant", "content": f"It is {a}."}])
            for q, a in QUESTIONS]


@needs_llama
def test_prompt_tokens_equal_the_transformers_tokenization(llama) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(resolve_model("smollm2").path)
    for prompt in prompts(llama):
        ids = llama.prompt_ids(prompt.text)
        assert ids == prompt_token_ids(hf, prompt.text)
        assert ids.count(1) == prompt.text.count("<|im_start|>")  # no BOS added on top
    assert llama.template.hash == load_template("llamacpp/smollm2").hash


@needs_llama
def test_turns_end_on_the_end_of_turn_token(llama) -> None:
    batch = [Request(p.text, GenerationParams(0.0, 1.0, 64), p.stop, 0) for p in prompts(llama)]
    turns = llama.complete(batch)
    assert all(g.error is None for g in turns)
    stopped = [g for g in turns if g.finish_reason == "stop"]
    assert stopped, [g.raw_text for g in turns]
    for turn in stopped:
        assert turn.raw_text.endswith("<|im_end|>") and "<|im_end|>" not in turn.text
    assert all(g.completion_tokens <= 64 and g.prompt_tokens > 20 for g in turns)


# --- stopping and clean text, against llama-cpp-python's documented API (no build needed) -------
#
# A stand-in for ``llama_cpp.Llama`` and the ``llama_cpp`` bindings: a vocabulary with two end
# tokens (<|im_end|>, the EOS, and <|endoftext|>, an EOG token that is neither EOS nor EOT, as in
# Qwen's GGUFs) and scripted generation. The real library runs the same code where installed.

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CONTROLS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = ["Why", " 26", "?", " more", " text"]


class FakeVocab:
    """llama_cpp's LlamaModel surface the backend reads: vocab, sizes, attributes, EOS/EOT."""

    def __init__(self) -> None:
        self.pieces = CONTROLS + WORDS + [chr(c) for c in range(32, 127)] + ["\n"]
        self.vocab, self.model = object(), object()

    def n_vocab(self) -> int:
        return len(self.pieces)

    def token_get_attr(self, token: int) -> int:
        return 1 << 3 if self.pieces[token] in CONTROLS else 1 << 2  # CONTROL / NORMAL

    def token_eos(self) -> int:
        return CONTROLS.index("<|im_end|>")

    def token_eot(self) -> int:
        return -1

    def add_bos_token(self) -> bool:
        return False


class FakeBindings:
    """``llama_cpp.llama_vocab_is_eog``: llama.cpp's EOG set holds both end tokens."""

    def __init__(self, vocab: FakeVocab) -> None:
        self.known = vocab

    def llama_vocab_is_eog(self, vocab: object, token: int) -> bool:
        assert vocab is self.known.vocab
        return self.known.pieces[token] in ("<|im_end|>", "<|endoftext|>")


class FakeLlama:
    def __init__(self, script: list[str]) -> None:
        self._model = FakeVocab()
        self.metadata = {"tokenizer.chat_template": CHATML, "tokenizer.ggml.eos_token_id": "2"}
        self.script = script

    def n_ctx(self) -> int:
        return 512

    def token_bos(self) -> int:
        return -1

    def detokenize(self, tokens, special: bool = False) -> bytes:
        return "".join(self._model.pieces[t] for t in tokens).encode()

    def tokenize(self, text: bytes, add_bos: bool = False, special: bool = False) -> list[int]:
        pieces, out, at, decoded = self._model.pieces, [], 0, text.decode()
        while at < len(decoded):
            matches = [i for i, p in enumerate(pieces) if decoded.startswith(p, at)
                       and (special or p not in CONTROLS)]
            best = max(matches, key=lambda i: len(pieces[i]))
            out.append(best)
            at += len(pieces[best])
        return out

    def set_seed(self, seed: int) -> None:
        pass

    def reset(self) -> None:
        pass

    def generate(self, ids, **settings):
        yield from (self._model.pieces.index(p) for p in self.script)


def fake_backend(script: list[str]):
    from userturn.backends.llamacpp import LlamaCppBackend
    from userturn.backends.models import ModelRef

    llama = FakeLlama(script)
    ref = ModelRef("llamacpp/fake.gguf", "llamacpp", "fake.gguf", "fake.gguf", "sha256:0")
    return LlamaCppBackend(ref, llama=llama, lib=FakeBindings(llama._model))


def probe_request(backend):
    prompt = render_user_turn(backend.template, [{"role": "user", "content": "Why?"},
                                                 {"role": "assistant", "content": "26"}])
    return Request(prompt.text, GenerationParams(0.0, 1.0, 20), prompt.stop, 0)


def test_an_eog_token_that_is_neither_eos_nor_eot_ends_the_turn() -> None:
    # Qwen ends turns with <|endoftext|>: the turn stops there, and nothing after it is kept.
    backend = fake_backend(["Why", " 26", "?", "<|endoftext|>", " more", " text"])
    (turn,) = backend.complete([probe_request(backend)])
    assert turn.finish_reason == "stop" and turn.completion_tokens == 4
    assert turn.raw_text == "Why 26?<|endoftext|>" and turn.text == "Why 26?"


def test_control_tokens_are_stripped_from_the_clean_text_as_transformers_does() -> None:
    backend = fake_backend(["<|im_start|>", "Why", " 26", "?", "<|im_end|>", " more"])
    (turn,) = backend.complete([probe_request(backend)])
    assert turn.finish_reason == "stop" and turn.raw_text == "<|im_start|>Why 26?<|im_end|>"
    assert turn.text == "Why 26?"  # no role token left in the visible text


def test_the_eog_set_falls_back_to_the_older_bindings() -> None:
    from userturn.backends.llamacpp import vocabulary_ends_and_controls

    vocab = FakeVocab()

    class Older:  # releases before the vocab API: llama_token_is_eog(model, token)
        def llama_token_is_eog(self, model: object, token: int) -> bool:
            assert model is vocab.model
            return vocab.pieces[token] == "<|endoftext|>"

    ends, controls = vocabulary_ends_and_controls(vocab, Older())
    assert ends == [0, 2]  # <|endoftext|> from the EOG test, <|im_end|> as the EOS
    assert controls == [0, 1, 2]


@needs_llama
def test_the_real_gguf_strips_what_the_transformers_tokenizer_strips(llama) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(resolve_model("smollm2").path)
    assert set(hf.all_special_tokens) <= set(llama._special)
    eos = hf.convert_tokens_to_ids("<|im_end|>")
    assert eos in llama._eos_ids
    # The real vocabulary has several end-of-generation tokens: <|endoftext|> (the GGUF's EOT
    # set by name, neither its EOS) ends a turn as well, as transformers' EOS list does.
    assert hf.convert_tokens_to_ids("<|endoftext|>") in llama._eos_ids
    assert len(llama._eos_ids) >= 2


@needs_llama
def test_a_local_judge_under_the_verdict_grammar_always_answers_in_format(llama) -> None:
    # SmolLM2 is no judge (its labels mean little), but under the grammar every verdict parses:
    # before the rationale was bounded, one ran to the token budget and was cut mid-string.
    from userturn.labels.judge import BackendChatClient, Judge
    from userturn.records import LABELS, Case

    judge = Judge(BackendChatClient(llama), concurrency=1, max_tokens=120)
    label = judge.classify(Case("Ann has 3 apples and buys 2. How many?",
                                "3 + 2 = 5. The answer is 5.", "Why did you add 2?"))
    assert label.error is None and label.label in LABELS and label.rationale


# --- past the end of sequence (the continuation arm) -----------------------------------------------

def test_past_the_end_only_a_stop_marker_or_the_budget_ends_the_turn() -> None:
    # Both end tokens of the vocabulary are written and kept; the request's own markers still stop.
    backend = fake_backend(["Why", " 26", "?", "<|im_end|>", "\n", "<|endoftext|>", " more",
                            " text"])
    base = probe_request(backend)
    (ended,) = backend.complete([base])
    assert (ended.raw_text, ended.finish_reason) == ("Why 26?<|im_end|>", "stop")
    to_marker, to_budget, to_end = backend.complete([
        Request(base.prompt, base.params, (" more",), 0, past_end=True),
        Request(base.prompt, GenerationParams(0.0, 1.0, 5), (), 0, past_end=True),
        Request(base.prompt, base.params, ("<|endoftext|>",), 0, past_end=True)])
    assert (to_marker.raw_text, to_marker.finish_reason) == \
        ("Why 26?<|im_end|>\n<|endoftext|> more", "stop")
    assert to_marker.text == "Why 26?" and to_marker.completion_tokens == 7
    assert (to_budget.raw_text, to_budget.finish_reason) == ("Why 26?<|im_end|>\n", "length")
    assert to_end.raw_text == "Why 26?<|im_end|>\n<|endoftext|>"  # a marker that is an end token


@needs_llama
def test_past_the_end_the_real_gguf_goes_on_after_its_end_of_turn(llama) -> None:
    budget = 64
    batch = [Request(p.text, GenerationParams(0.0, 1.0, budget), p.stop, 0)
             for p in prompts(llama)]
    ended = llama.complete(batch)
    past = llama.complete([Request(r.prompt, r.params, (), 0, past_end=True) for r in batch])
    stopped = [(a, b) for a, b in zip(ended, past) if a.finish_reason == "stop"
               and a.completion_tokens < budget and a.raw_text.endswith("<|im_end|>")]
    assert stopped, [g.raw_text for g in ended]
    for before, after in stopped:
        # The same greedy tokens up to the end of turn, which is now written and gone past.
        assert after.raw_text.startswith(before.raw_text)
        assert (after.finish_reason, after.completion_tokens) == ("length", budget)
        assert "<|im_end|>" not in after.text


@needs_llama
def test_option_scores_equal_a_plain_pass_with_every_position_s_logits(llama) -> None:
    """Next-role scores at the end of a closed conversation, against llama.cpp evaluating the
    prompt and each option in one batch with the logits of every position kept."""
    import numpy as np
    from llama_cpp import Llama

    prompt = llama.template.render([{"role": "user", "content": QUESTIONS[0][0]},
                                    {"role": "assistant", "content": "26 pencils are left."}])
    options = ["<|im_start|>user\n", "<|im_start|>assistant\n", "<|endoftext|>", " Thanks"]
    scores = llama.score_options(prompt, options, whole=True)
    plain = Llama(model_path=str(smollm2_gguf()), n_ctx=2048, logits_all=True, verbose=False)
    ids = llama.prompt_ids(prompt)
    for option, score in zip(options, scores):
        extra = plain.tokenize(option.encode("utf-8"), add_bos=False, special=True)
        plain.reset()
        plain.eval(ids + extra)
        logits = np.asarray(plain.scores[len(ids) - 1:len(ids) - 1 + len(extra)], dtype=np.float64)
        top = logits.max(axis=1, keepdims=True)
        logp = logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))
        # One batch against one token at a time: llama.cpp's kernels differ in their rounding.
        assert score == pytest.approx(sum(logp[j, t] for j, t in enumerate(extra)), abs=1e-2)
