"""The last inputs that gave a traceback, a hang or a silent wrong success: each now gets one
line (exit 2) and leaves nothing behind; a second interrupt exits at once with one line."""

from __future__ import annotations

import errno
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import one_error
from openai_fake import Answer, FakeOpenAI

from userturn.chat.render import ChatTemplate
from userturn.cli.main import main

RUN = ["--model", "fake/probe", "--dataset", "gsm_symbolic", "--limit", "2", "--samples", "1"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")




def test_classify_of_a_line_nested_too_deep_or_with_a_lone_surrogate_is_one_line(tmp_path,
                                                                                  capsys):
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"query": ' + "[" * 100_000 + "]" * 100_000
                    + ', "answer": "4", "user_turn": "Why?"}\n')
    assert one_error(capsys, "classify", str(deep), "--labeller", "rules") == (
        f"userturn: error: {deep}: line 1: invalid JSON (nested too deep to read)")
    lone = tmp_path / "lone.jsonl"
    lone.write_text('{"query": "2+2?", "answer": "4", "user_turn": "Why \\ud800?"}\n')
    assert "line 1: field 'user_turn': invalid text (a lone surrogate" in one_error(
        capsys, "classify", str(lone), "--labeller", "rules")


def test_run_into_an_empty_or_over_long_folder_name_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert "output is empty" in one_error(capsys, "run", *RUN, "-o", "")
    long_name = "a" * 300
    assert "is 300 bytes long; a file system takes at most 255" in one_error(
        capsys, "run", *RUN, "-o", long_name)
    assert list(tmp_path.iterdir()) == []  # no run stored in the current folder


def test_a_name_too_long_for_the_file_system_is_one_line_in_every_command(tmp_path, capsys):
    long_name = str(tmp_path / ("b" * 300))
    run = tmp_path / "run"
    assert main(["run", *RUN, "-o", str(run)]) == 0
    capsys.readouterr()
    for argv in (["report", long_name], ["doctor", long_name], ["label", long_name],
                 ["export", str(run), "--out", long_name], ["compare", str(run), long_name],
                 ["export-task", str(run), "-o", long_name], ["classify", long_name],
                 ["report", str(run), "--figures", long_name], ["render", "--template",
                                                                  long_name],
                 ["train", "sft", "--model", "tiny", "--data", long_name, "--output",
                  str(tmp_path / "t")]):
        err = one_error(capsys, *argv)
        assert "is 300 bytes long" in err or "longer than the file system takes" in err, argv


def test_train_output_that_is_a_file_or_data_that_is_empty_is_refused_making_nothing(
        tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    a_file = tmp_path / "taken"
    a_file.write_text("mine")
    assert "is a file, not a folder" in one_error(
        capsys, "train", "sft", "--model", "tiny", "--data", str(empty), "--output", str(a_file))
    assert a_file.read_text() == "mine"
    out = tmp_path / "new"
    one_error(capsys, "train", "sft", "--model", "tiny", "--data", str(empty), "--output",
              str(out))
    assert not out.exists()  # no empty folder for a refusal


class CloseFails:
    """The lock file a writer opens, whose writes reach only the page cache: the full disk is
    reported at close, as some file systems (NFS, FUSE, quotas) do."""

    def __init__(self, file) -> None:  # type: ignore[no-untyped-def]
        self.file = file

    def __getattr__(self, name):  # type: ignore[no-untyped-def]
        return getattr(self.file, name)

    def close(self) -> None:
        self.file.close()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def open_for_a_full_disk(path, mode="r", *args, **kwargs):  # type: ignore[no-untyped-def]
    import builtins

    handle = builtins.open(path, mode, *args, **kwargs)
    return CloseFails(handle) if "a" in mode else handle  # readers peeking are not writing


def test_a_full_disk_at_the_locks_release_is_no_traceback(tmp_path, capsys, monkeypatch):
    from userturn.store import lock

    monkeypatch.setattr(lock, "open", open_for_a_full_disk, raising=False)
    folder = tmp_path / "run"
    assert main(["run", *RUN, "-o", str(folder)]) == 0  # the run is stored: that is success
    assert "Traceback" not in capsys.readouterr().err
    assert main(["label", str(folder), "--labeller", "rules"]) == 0  # the lock was released
    assert "Traceback" not in capsys.readouterr().err
    new = tmp_path / "new"
    err = one_error(capsys, "run", *RUN[:2], "--dataset", str(tmp_path / "missing.jsonl"),
                    "-o", str(new))
    assert "missing.jsonl" in err
    assert not new.exists()  # no empty folder, no lock file


STEPS = "RenderBudgetExceeded: its loops and calls took more than 1,000,000 steps"
CHARACTERS = "RenderBudgetExceeded: it asks for more than 50,000,000 characters"


@pytest.mark.parametrize("body, words", [
    ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}", STEPS),
    ("{% for i in range(99999) %}{% for j in range(99999)|reverse %}{% endfor %}{% endfor %}",
     STEPS),
    ("{% for i in range(99999) %}{{ range(99999)|list|length }}{% endfor %}", CHARACTERS)])
def test_nested_loops_in_a_template_are_refused_quickly(body, words, tmp_path, capsys):
    template = tmp_path / "loops.jinja"
    template.write_text(CHATML + body)
    started = time.monotonic()
    err = one_error(capsys, "render", "--template", str(template))
    assert time.monotonic() - started < 10  # ten billion steps, refused within seconds
    assert f"loops.jinja failed: {words}" in err


GIGABYTE = 1 << 30


def in_a_gigabyte() -> None:
    """The child may map one gigabyte: a render that would make a gigabyte fails there (a
    MemoryError, not the budget's line) instead of filling the test machine's memory."""
    resource.setrlimit(resource.RLIMIT_AS, (GIGABYTE, GIGABYTE))


def bounded_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a child held to a gigabyte and a minute: a render that is not bounded fails
    this test instead of hanging it or eating the machine."""
    return subprocess.run([sys.executable, "-m", "userturn.cli.main", *argv],
                          capture_output=True, text=True, timeout=60, preexec_fn=in_a_gigabyte)


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    err = done.stderr.strip()
    assert done.returncode == 2 and err.count("\n") == 0 and "Traceback" not in err, err
    return err


# What each body asks of one render: a gigabyte in one value, a gigabyte through a width or a
# format, ten billion loop steps over a string, a string doubled forty times.
HUGE = [
    ("{{ 'x' * 1000000000 }}", CHARACTERS),
    ("{{ [1] * 1000000000 }}", CHARACTERS),
    ("{% set s = 'x' * 99999 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}", STEPS),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
     "{% endfor %}{{ ns.s|length }}", CHARACTERS),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
     "{% endfor %}{{ ns.s|length }}", CHARACTERS),
    ("{{ 'x'|center(10**9) }}", CHARACTERS),
    ("{{ '{:>1000000000}'.format('x') }}", CHARACTERS),
    ("{{ '%1000000000s' % 'x' }}", CHARACTERS),
    ("{{ range(99999)|map('center', 99999)|join }}", CHARACTERS),
    ("{% macro twice(n) %}{% if n %}{{ twice(n - 1) }}{{ twice(n - 1) }}{% endif %}"
     "{% endmacro %}{{ twice(40) }}", "RenderBudgetExceeded: it"),
]


@pytest.mark.parametrize("body, words", HUGE)
def test_a_template_that_asks_for_gigabytes_or_hours_is_refused_in_seconds(body, words,
                                                                          tmp_path):
    template = tmp_path / "huge.jinja"
    template.write_text(CHATML + body)
    started = time.monotonic()
    done = bounded_cli("render", "--template", str(template))
    assert time.monotonic() - started < 30
    assert f"huge.jinja failed: {words}" in one_line(done)
    assert done.stdout == ""  # no prompt printed


def test_a_run_with_a_template_variant_past_the_budget_is_refused_leaving_no_folder(tmp_path):
    template = tmp_path / "variant.jinja"
    template.write_text(CHATML + HUGE[2][0])  # nested loops over a string: hung for hours
    out = tmp_path / "run"
    done = bounded_cli("run", *RUN, "--user-turn-variant", f"template:{template}", "-o",
                       str(out))
    err = one_line(done)
    assert f"user-turn variant template:{template} on fake/probe: chat template of" in err
    assert STEPS in err
    assert not out.exists()


def test_what_the_budget_watches_renders_as_transformers_renders_it():
    """Loops over strings and lists (loop.length, loop.last, recursion), ~, literals, formats,
    joins, widths and JSON: each on the budget, each as transformers' own render has it."""
    from transformers.utils.chat_template_utils import render_jinja_template

    source = CHATML + (
        "[{% for c in 'abc' %}{{ c }}{{ loop.index }}/{{ loop.length }}"
        "{{ '.' if loop.last }}{% endfor %}]"
        "[{% for t in [{'n': 'a', 'kids': [{'n': 'b', 'kids': []}]}] recursive %}{{ t.n }}"
        "{{ loop(t.kids) }}{% endfor %}]"
        "[{% for k, v in {'x': 1}.items() %}{{ k ~ '=' ~ v }}{% endfor %}]"
        "[{{ '%s-%03d' % ('a', 7) }}|{{ '{}+{x}'.format(1, x=2) }}|{{ ', '.join(['p', 'q']) }}"
        "|{{ ['p', 'q']|join('/') }}|{{ [[1], [2]]|sum(start=[]) }}|{{ 'ab'|center(6) }}"
        "|{{ 'ab'.rjust(4, '.') }}|{{ {'a': [1]}|tojson(indent=1) }}|{{ (1, 2) + (3,) }}"
        "|{{ 2 ** 10 }}|{{ [1, 2, 3]|batch(2)|list }}]")
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    ours = ChatTemplate(source, "busy").render(messages, add_generation_prompt=True)
    theirs, _ = render_jinja_template(conversations=[messages], chat_template=source,
                                      add_generation_prompt=True, bos_token="", eos_token="")
    assert ours == theirs[0]
    assert ours.endswith("[a1/3b2/3c3/3.][ab][x=1][a-007|1+2|p, q|p/q|[1, 2]|  ab  |..ab|"
                         '{\n "a": [\n  1\n ]\n}|(1, 2, 3)|1024|[[1, 2], [3]]]')


def judge_labels(folder: Path) -> int:
    with sqlite3.connect(f"{(folder / 'userturn.db').as_uri()}?mode=ro", uri=True) as db:
        count = db.execute("SELECT COUNT(*) FROM labels WHERE source LIKE 'judge:%' "
                           "AND error IS NULL").fetchone()[0]
    db.close()
    return int(count)


def wait_for(condition, seconds: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def as_in_a_terminal() -> None:
    """The child starts with Ctrl-C's default disposition, as a command typed in a terminal does.
    A job started in the background by a non-interactive shell (``make test &``, a CI runner)
    inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler: the child
    never saw the first SIGINT, and this test timed out waiting for its line."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("first", [signal.SIGINT, signal.SIGTERM])
def test_a_second_interrupt_during_judge_exits_at_once_with_what_was_received(first, tmp_path,
                                                                              capsys):
    folder = tmp_path / "run"
    assert main(["run", *RUN, "-o", str(folder)]) == 0  # four user turns
    capsys.readouterr()
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    first_line = "userturn: interrupted;" if first == signal.SIGINT else \
        "userturn: terminated (SIGTERM);"
    errors = tmp_path / "stderr.txt"
    with FakeOpenAI() as fake, errors.open("w") as stderr:
        fake.then(Answer(), Answer())
        fake.always(Answer(delay=60.0))  # two requests stay in flight
        judging = subprocess.Popen(
            [sys.executable, "-m", "userturn.cli.main", "judge", str(folder), "--judge",
             "openai/j", "--base-url", fake.url, "--scope", "all", "--concurrency", "2"],
            stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
            preexec_fn=as_in_a_terminal)
        wait_for(lambda: len(fake.requests) >= 4)
        wait_for(lambda: judge_labels(folder) == 2, seconds=10)
        judging.send_signal(first)
        # The first interrupt is handled (its line is out); the in-flight requests wait on.
        # The line comes within a second (the requests wait 60 s); the timeouts seen in the full
        # suite were the inherited SIGINT disposition (see as_in_a_terminal), not the load.
        wait_for(lambda: first_line in errors.read_text(), seconds=30)
        assert judging.poll() is None
        judging.send_signal(signal.SIGINT)
        started = time.monotonic()
        judging.communicate(timeout=20)
        assert time.monotonic() - started < 5  # at once, not after the 60 s requests
    err = errors.read_text()
    assert judging.returncode == (130 if first == signal.SIGINT else 143), err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines[-2].startswith(first_line)
    assert lines[-1].startswith("userturn: interrupted again: exiting now without waiting for 2 "
                                "request(s) in flight")
    assert judge_labels(folder) == 2


def test_a_tokenizer_config_nested_too_deep_is_one_line(tmp_path, capsys):
    config = tmp_path / "tokenizer_config.json"
    config.write_text('{"chat_template": ' + "[" * 100_000 + '"x"' + "]" * 100_000 + "}")
    assert one_error(capsys, "render", "--template", str(config)) == (
        f"userturn: error: {config} is not valid JSON: nested too deep to read")
