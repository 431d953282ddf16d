"""The HTTP client of OpenAI-compatible servers: what is transient is retried (429 after its
Retry-After, 5xx, read timeouts, dropped connections), what is not fails at once (a dead address
is one line within seconds, not minutes of retries), and the key stays out of every message."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from helpers import GSM_ITEMS, GSM_SAMPLES, experiment, one_error, undecided_script
from openai_fake import Fail, FakeOpenAI

from userturn.backends.fake import ScriptedBackend
from userturn.cli.main import main
from userturn.labels.judge import Judge, OpenAIChatClient
from userturn.probe.pipeline import run_experiment
from userturn.records import Case

KEY = "sk-test-0123456789abcdefghijklmnop"
CASE = Case(query="What is 3 x 12?", answer="36.", user_turn="Why 36?")


@pytest.fixture(autouse=True)
def _offline_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy",
                 "ALL_PROXY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def dead_url() -> str:
    """An address nobody listens on: the port is bound, then closed again."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A server whose accept queue is full: a connect gets no answer, as from a host behind a
    firewall that drops packets."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    queued = []
    for _ in range(3):
        client = socket.socket()
        client.setblocking(False)
        client.connect_ex(("127.0.0.1", port))
        queued.append(client)
    time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/v1"
    for sock in (*queued, server):
        sock.close()


def test_a_dead_base_url_is_one_line_within_seconds(dead_url: str, tmp_path, capsys) -> None:
    started = time.monotonic()
    line = one_error(capsys, "run", "--model", "openai/served", "--tokenizer", "tiny",
                     "--base-url", dead_url, "--limit", "2", "-o", str(tmp_path / "run"))
    assert time.monotonic() - started < 5.0  # it was 19-25 s: five tries, a growing backoff
    assert line == (f"userturn: error: {dead_url}/completions cannot be used (connection "
                    "failed: [Errno 111] Connection refused (attempt 1/5))")
    assert not (tmp_path / "run").exists()


def test_a_judge_on_a_dead_base_url_fails_within_seconds(dead_url: str, gsm_file, tmp_path,
                                                         capsys) -> None:
    exp = experiment(gsm_file, tmp_path)
    run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)}).close()
    capsys.readouterr()
    started = time.monotonic()
    code = main(["judge", str(exp.plan.output), "--judge", "openai/j", "--base-url", dead_url,
                 "--scope", "all"])
    assert time.monotonic() - started < 5.0  # it was 37 s: five tries per turn
    judged = GSM_ITEMS * (1 + GSM_SAMPLES)
    assert code == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"userturn: error: {judged} of {judged} judge request(s) failed; the first: request "
        "failed: connection failed: [Errno 111] Connection refused (attempt 1/5)")


def test_a_refused_connection_is_not_retried(dead_url: str) -> None:
    sleeps: list[float] = []
    client = OpenAIChatClient("j", base_url=dead_url, api_key=KEY, sleep=sleeps.append)
    [label] = Judge(client).classify_many([CASE])
    assert label.error == ("request failed: connection failed: [Errno 111] Connection refused "
                           "(attempt 1/5)")
    assert sleeps == []


def test_a_server_that_never_accepts_costs_one_connect_timeout_not_one_per_request(
        silent_url: str) -> None:
    sleeps: list[float] = []
    client = OpenAIChatClient("j", base_url=silent_url, api_key=KEY, timeout=0.5,
                              sleep=sleeps.append)
    started = time.monotonic()
    labels = Judge(client, concurrency=2).classify_many([CASE] * 16)
    # Without the pause after a failed connect: 8 rounds of 0.5 s (and 5 tries each before).
    assert time.monotonic() - started < 2.5
    assert {label.error for label in labels} == {
        "request failed: connection failed: timed out (attempt 1/5)"}
    assert sleeps == []


def test_429_with_retry_after_is_waited_out_then_answered() -> None:
    sleeps: list[float] = []
    with FakeOpenAI() as fake:
        later = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 3))
        fake.then(Fail(429, retry_after="2"), Fail(503, retry_after=later))
        client = OpenAIChatClient("j", base_url=fake.url, api_key=KEY, sleep=sleeps.append)
        [label] = Judge(client).classify_many([CASE])
        assert len(fake.requests) == 3
    assert label.label == "generic" and label.error is None
    assert sleeps[0] == 2.0 and 1.0 <= sleeps[1] <= 3.0  # seconds, then an HTTP date


def test_429_forever_gives_up_after_the_bounded_attempts_with_the_servers_words() -> None:
    sleeps: list[float] = []
    with FakeOpenAI() as fake:
        fake.always(Fail(429, retry_after="1", body=f'{{"error": "slow down {KEY}"}}'))
        client = OpenAIChatClient("j", base_url=fake.url, api_key=KEY, sleep=sleeps.append,
                                  max_attempts=3)
        [label] = Judge(client).classify_many([CASE])
    assert sleeps == [1.0, 1.0]
    assert label.error == ('request failed: HTTP 429: {"error": "slow down [redacted]"} '
                           "(attempt 3/3)")
