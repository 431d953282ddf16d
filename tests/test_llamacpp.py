"""llama.cpp backend: GGUF specs and their embedded template (always), and, where llama-cpp-python
is installed, the prompt tokens and turns it produces on the SmolLM2 GGUF."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import QUESTIONS

from userturn.backends import load_backend, load_template
from userturn.errors import ModelError
from userturn.models import resolve_model, smollm2_gguf
from userturn.records import GenerationParams, Request
from userturn.render import prompt_token_ids, render_user_turn

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
