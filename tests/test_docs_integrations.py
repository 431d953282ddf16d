"""Every command of docs/integrations.md and of the README's integration section, run as
printed (bash lines through bash, Python blocks through Python) in one working folder, in the
order a reader meets them; or skipped with the reason: it needs the network, the optional
lm-eval venv (`make lmeval`), SmolLM2 generation (USERTURN_SLOW=1 runs those), or the output
of a command that was skipped. Where the command that makes the run folder is skipped, the
folder is a scripted run, so the commands after it still run as printed."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import fake_probe_run

ROOT = Path(__file__).resolve().parents[1]
LM_EVAL_BIN = ROOT / ".venv-lmeval" / "bin"
SLOW = os.environ.get("USERTURN_SLOW") == "1"
INSPECT_VIEW_PORT = 7575  # `inspect view`'s default
# A reader meets the commands in the document's order and each may need what the one before
# made: `make test-random` shuffles the modules, never the commands of this one.
pytestmark = pytest.mark.random_order(disabled=True)


def doc_commands(path: Path, section: str | None = None) -> list[tuple[str, str]]:
    """("bash", line) per command line (continuations joined) and ("python", block) per Python
    block of the markdown file, or of its ``## section`` alone."""
    text = path.read_text(encoding="utf-8")
    if section is not None:
        start = text.index(f"## {section}")
        end = text.find("\n## ", start + 1)
        text = text[start:end if end > 0 else None]
    commands: list[tuple[str, str]] = []
    for language, body in re.findall(r"```(bash|python)\n(.*?)```", text, flags=re.S):
        if language == "python":
            commands.append(("python", body))
            continue
        for line in body.replace("\\\n", " ").splitlines():
            if line.strip():
                commands.append(("bash", line.strip()))
    return commands


DOCS = doc_commands(ROOT / "docs" / "integrations.md")
README = doc_commands(ROOT / "README.md", "Where you already work: lm-eval, Inspect, Hugging Face")


def outputs(command: str) -> list[str]:
    """The paths a command writes (its -o, --out or --output_path)."""
    words = shlex.split(command.split("#")[0].replace("$(", "").replace(")", ""))
    return [words[i + 1] for i, word in enumerate(words[:-1])
            if word in ("-o", "--out", "--output_path")]


class Reader:
    """A reader working through one document: its folder, what the commands made or could
    not make (the skipped commands' outputs)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.missing: dict[str, str] = {}
        self.stand_in = False  # a scripted run stands in for the SmolLM2 run the docs make
        bin_dir = folder / ".bin"
        bin_dir.mkdir()
        userturn = bin_dir / "userturn"  # the worktree's userturn, as the installed command
        userturn.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m userturn.cli.main "$@"\n')
        userturn.chmod(0o755)
        path = [str(bin_dir), str(Path(sys.executable).parent), os.environ.get("PATH", "")]
        if LM_EVAL_BIN.exists():
            path.insert(1, str(LM_EVAL_BIN))
        self.env = {**os.environ, "PATH": os.pathsep.join(path),
                    "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
                                                   os.environ.get("PYTHONPATH", "")]),
                    "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                    "HF_DATASETS_CACHE": str(folder / ".hf-cache")}

    def scripted_run(self, where: str) -> None:
        self.stand_in = True
        (self.folder / ".scripted").mkdir()
        (self.folder / where).parent.mkdir(parents=True, exist_ok=True)
        fake_probe_run(self.folder / ".scripted").folder.rename(self.folder / where)

    def why_not(self, kind: str, command: str) -> str | None:
        """Why the command cannot run here (None: it runs)."""
        if command.startswith("pip install"):
            return "needs the network (a package index)"
        if "hf upload" in command or "push_to_hub" in command:
            return "needs the network (the Hugging Face hub)"
        if command.startswith("make ") and "lmeval" in command:
            return "builds the optional .venv-lmeval (needs the network)"
        if command.startswith("lm-eval") and not LM_EVAL_BIN.exists():
            return "needs lm-eval from the optional .venv-lmeval (`make lmeval`)"
        if command.startswith("lm-eval run") and self.stand_in:
            return ("runs SmolLM2's exported task, which the scripted stand-in run has not: "
                    "USERTURN_SLOW=1 makes the real run")
        if "smollm2" in command and not SLOW and (
                kind == "python" or command.startswith("userturn run")):
            return "generates with SmolLM2 (minutes on 2 cores): USERTURN_SLOW=1 runs it"
        for path, reason in self.missing.items():
            if re.search(rf"(^|[\s=/]){re.escape(path)}(\s|$|/)", command):
                return f"needs {path}, which {reason}"
        return None

    def run(self, kind: str, command: str) -> None:
        reason = self.why_not(kind, command)
        if reason is not None:
            made = outputs(command) if kind == "bash" else []
            if command.startswith("userturn run") and made:
                # Every later command needs a run folder: a scripted one stands in for it.
                self.scripted_run(made[0])
                made = []
            for path in made:
                self.missing[path.rstrip("/")] = f"`{command.split('#')[0].strip()}` makes"
            pytest.skip(reason)
        if command.startswith("inspect view"):
            return self.serve(command)
        argv = ["bash", "-c", command] if kind == "bash" else [sys.executable, "-c", command]
        done = subprocess.run(argv, cwd=self.folder, env=self.env, capture_output=True,
                              text=True, timeout=1800)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"

    def serve(self, command: str) -> None:
        """`inspect view` serves until stopped: it must answer on its port, then it is."""
        server = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=self.folder,
                                  env=self.env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    with urllib.request.urlopen(
                            f"http://127.0.0.1:{INSPECT_VIEW_PORT}/", timeout=5) as page:
                        assert page.status == 200
                        return
                except OSError:
                    assert server.poll() is None, f"{command} exited {server.returncode}"
                    assert time.monotonic() < deadline, f"{command} never served"
                    time.sleep(1)
        finally:
            server.terminate()
            server.wait(timeout=30)


@pytest.fixture(scope="module")
def docs_reader(tmp_path_factory):
    return Reader(tmp_path_factory.mktemp("docs-integrations"))


@pytest.fixture(scope="module")
def readme_reader(tmp_path_factory):
    reader = Reader(tmp_path_factory.mktemp("readme-integrations"))
    # runs/demo is the quickstart's run (`make demo`: SmolLM2, minutes): a scripted run here.
    reader.scripted_run("runs/demo")
    return reader


@pytest.mark.parametrize("kind, command", DOCS, ids=[c[:60] for _, c in DOCS])
def test_docs_integrations_command_runs_as_printed(docs_reader, kind, command):
    docs_reader.run(kind, command)


@pytest.mark.parametrize("kind, command", README, ids=[c[:60] for _, c in README])
def test_readme_integrations_command_runs_as_printed(readme_reader, kind, command):
    readme_reader.run(kind, command)


def test_the_documents_have_the_commands_this_test_runs():
    """The extraction finds what a reader sees: not an empty list that passes vacuously."""
    bash = [c for kind, c in DOCS if kind == "bash"]
    assert any(c.startswith("userturn export-task") for c in bash)
    assert any(c.startswith("lm-eval ls tasks --include_path") for c in bash)
    assert not any("huggingface-cli" in c or "--tasks list" in c for c in bash)
    assert sum(kind == "python" for kind, _ in DOCS) >= 2
    assert any("conversations = [" in c for kind, c in DOCS if kind == "python")
    assert any(c.startswith("userturn corpus export") for _, c in README)
