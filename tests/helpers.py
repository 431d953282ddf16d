"""What several test files share: scripted runs, the chat-template fixtures and goldens, the CLI
as a user calls it, the annotation server's API, the report's two-model run and raw reads of a
run folder. A test file imports from here (or from a fake such as openai_fake), never from
another test file: tests/test_test_imports.py keeps it so."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

import pytest
from conftest import QUESTIONS

from userturn.backends.fake import ScriptedBackend
from userturn.chat.render import ChatTemplate
from userturn.cli.main import main
from userturn.config import Experiment
from userturn.labels.annotate import AnnotationServer
from userturn.probe.pipeline import run_experiment
from userturn.records import Request
from userturn.store.database import RunStore

TESTS = Path(__file__).parent

# -- scripted runs on the six-question GSM8K file (conftest's gsm_file) --------------------------
GSM_ITEMS = 6  # every question of gsm_file
GSM_SAMPLES = 3  # sampled user turns per item at T > 0


def is_user_turn(request: Request) -> bool:
    """The probe's request: a ChatML prompt that ends in an open user turn."""
    return request.prompt.endswith("<|im_start|>user\n")


def grounded_script(request: Request) -> str:
    """Correct answers for the first three questions; a grounded follow-up at T > 0 only."""
    if not is_user_turn(request):
        correct = any(q in request.prompt for q in ("3 boxes", "45 apples", "20 pages"))
        return "Let me compute. #### 26" if "3 boxes" in request.prompt else (
            "The answer is 135." if "45 apples" in request.prompt else (
                "So 20 * 6 = 120. #### 120" if correct else "#### 1"))
    if request.params.temperature > 0:
        numbers = re.findall(r"\d+", request.prompt.rsplit("assistant", 1)[1])
        number = numbers[-1] if numbers else "that"
        return f"Why did you get {number}? I think it should be 27."
    return "Thank you!"


def undecided_script(request: Request) -> str:
    """Greedy user turns are clear (generic); sampled ones are ambiguous (rules: undecided), so
    they are what a judge is asked about."""
    if not is_user_turn(request):
        return "#### 26"
    return "Thanks!" if request.params.temperature == 0 else "Is that right? I am not sure."


def experiment(gsm_file: Path, tmp_path: Path, **changes: Any) -> Experiment:
    """The scripted model on gsm_file: greedy and T = 1, GSM_SAMPLES samples each."""
    settings = dict(models=["fake/scripted"], datasets=[str(gsm_file)], limit=GSM_ITEMS,
                    temperatures=[0.0, 1.0], samples=GSM_SAMPLES, output=tmp_path / "run")
    return Experiment(**{**settings, **changes})


def run_scripted(exp: Experiment, backend: ScriptedBackend) -> RunStore:
    return run_experiment(exp, backends={exp.plan.models[0]: backend})


THINKING_ITEMS = 3  # the first three questions of gsm_file


def thinking_experiment(gsm_file: Path, out: Path, **changes: Any) -> Experiment:
    """A scripted Qwen3 (a thinking model) on THINKING_ITEMS questions, greedy only."""
    settings = dict(models=["fake/qwen3"], datasets=[str(gsm_file)], limit=THINKING_ITEMS,
                    temperatures=[0.0], user_max_tokens=12, output=out)
    return Experiment(**{**settings, **changes})


# A ShareGPT file: a conversation with a real next user turn, one ending in thanks, one that
# has no assistant reply (so no probe).
SHAREGPT_CONVERSATIONS = [
    {"id": "c1", "conversations": [
        {"from": "human", "value": "How do I boil an egg?"},
        {"from": "gpt", "value": "Put it in boiling water for 9 minutes, then cool it."},
        {"from": "human", "value": "Why 9 minutes and not 5?"}]},
    {"id": "c2", "conversations": [
        {"from": "human", "value": "Name a prime number."},
        {"from": "gpt", "value": "7 is a prime number."},
        {"from": "human", "value": "Thanks!"}]},
    {"id": "c3", "conversations": [{"from": "human", "value": "Only a question, no reply."}]},
]


# -- chat-template fixtures and golden renders (tests/fixtures/templates, tests/golden) ----------
TEMPLATES = TESTS / "fixtures" / "templates"
GOLDEN = TESTS / "golden"
UPDATE_GOLDEN = os.environ.get("UPDATE_GOLDEN") == "1"
FAMILIES: dict[str, dict] = json.loads((TEMPLATES / "families.json").read_text(encoding="utf-8"))
# The published formats (tests/fixtures/templates/published/): each one's file and special tokens.
PUBLISHED: dict[str, dict] = json.loads(
    (TEMPLATES / "published" / "families.json").read_text(encoding="utf-8"))
# Known render.py bugs, each a strict xfail so that a fix shows up as an XPASS. None open now.
KNOWN_BUGS: dict[tuple[str, str], str] = {}

# The conversation every family's golden renders.
SYSTEM = "You are a careful math tutor. Answer step by step."
QUERY = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips to her "
    "friends in May. How many clips did Natalia sell altogether in April and May?"
)
ANSWER = (
    "In May she sold 48 / 2 = 24 clips.\nAltogether she sold 48 + 24 = 72 clips.\nThe answer is 72."
)
THOUGHT = "Half of 48 is 24, so the total is 48 + 24."


def load_family(name: str, **overrides: Any) -> ChatTemplate:
    """The hand-written template of family ``name`` (families.json), its variables overridden."""
    spec = FAMILIES[name]
    variables = {**spec.get("variables", {}), **overrides}
    return ChatTemplate(
        source=(TEMPLATES / spec["file"]).read_text(encoding="utf-8"),
        model=f"fixture/{name}",
        bos_token=spec["bos_token"],
        eos_token=spec["eos_token"],
        variables=variables,
    )


def load_published(name: str) -> ChatTemplate:
    """The published prompt format of family ``name`` (published/families.json)."""
    spec = PUBLISHED[name]
    return ChatTemplate((TEMPLATES / "published" / spec["file"]).read_text(encoding="utf-8"),
                        f"published/{name}", spec["bos_token"], spec["eos_token"])


def read_exact(path: Path) -> str:
    with path.open(encoding="utf-8", newline="") as f:
        return f.read()


def write_exact(path: Path, text: str) -> None:
    with path.open("w", encoding="utf-8", newline="") as f:
        f.write(text)


def compare_or_update(check: str, name: str, path: Path, actual: str) -> None:
    """``actual`` must equal the golden at ``path``; UPDATE_GOLDEN=1 rewrites it instead."""
    if UPDATE_GOLDEN and (check, name) not in KNOWN_BUGS:
        write_exact(path, actual)
        pytest.skip(f"wrote {path.relative_to(TESTS)}; read it before committing")
    assert path.exists(), f"missing golden {path}; run with UPDATE_GOLDEN=1 and check it by eye"
    assert actual == read_exact(path)


# -- the command line -------------------------------------------------------------------------
def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``userturn ARGS`` in-process: the exit code, stdout and stderr."""
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error(capsys: pytest.CaptureFixture[str], *argv: str, code: int = 2) -> str:
    """Run the CLI; assert it exits ``code`` with exactly one stderr line and no traceback;
    return that line."""
    assert main(list(argv)) == code
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert "Traceback" not in err
    return err


def assert_one_line_error(code: int, err: str, needle: str) -> None:
    """Misuse: exit 2 and one ``userturn: error:`` line naming ``needle``, no traceback."""
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "userturn: error:" in lines[0] and needle in lines[0], err
    assert "Traceback" not in err


# -- the annotation server ----------------------------------------------------------------------
MARKUP_PAYLOAD = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
ANNOTATION_ITEMS, ANNOTATION_SAMPLES = 6, 2


def annotation_script(request: Request) -> str:
    """Answers; every user turn is unique (question number, seed) and carries MARKUP_PAYLOAD."""
    if not is_user_turn(request):
        return "Let me see. The answer is 42.\n  indented line\n#### 42"
    number = re.findall(r"\d+", request.prompt)[0]
    if request.params.temperature == 0:
        return f"Thanks for question {number}! {MARKUP_PAYLOAD}"
    return f"Why {number}? (seed {request.seed})\n\t{MARKUP_PAYLOAD}"


def annotation_run(gsm_file: Path, tmp_path: Path, **backend: Any) -> Path:
    """A finished run of annotation_script to annotate; its folder."""
    exp = Experiment(models=["fake/scripted"], datasets=[str(gsm_file)], limit=ANNOTATION_ITEMS,
                     temperatures=[0.0, 1.0], samples=ANNOTATION_SAMPLES, output=tmp_path / "run")
    run_experiment(exp, backends={"fake/scripted": ScriptedBackend(annotation_script, **backend)}
                   ).close()
    return exp.plan.output


def call_api(server: AnnotationServer, path: str, body: Any = None,
             headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """GET (or POST ``body`` as JSON) ``path`` on the server: the status and the decoded answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(server.url + path.lstrip("/"), data=data,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
            kind = response.headers.get_content_type()
            return response.status, json.loads(raw) if kind == "application/json" else raw.decode()
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def human_labels(folder: Path, name: str) -> dict[str, tuple[str, str, str]]:
    """What annotator ``name`` stored: key -> (label, rationale, version)."""
    store = RunStore.open(folder)
    rows = store.db.execute("SELECT key, label, rationale, version FROM labels WHERE source = ?",
                            (f"human:{name}",)).fetchall()
    store.close()
    return {r["key"]: (r["label"], r["rationale"], r["version"]) for r in rows}


# -- the report's run: two scripted models, three temperatures, perturbations --------------------
REPORT_TEMPERATURES = [0.0, 0.7, 1.0]
REPORT_SAMPLES = 3
REPORT_PERTURBATIONS = ["truncate", "append_question:specific", "wrong_answer"]
SCRIPT_TAG = "<script>window.__pwned=1</script>"
IMG_TAG = '</script><img src=x onerror="window.__pwned=2">'
BOLD = "<b>bold</b>"


def report_script(model: str) -> Callable[[Request], str]:
    """alpha answers 3 of 6 questions right, beta 1; user turns mix follow-ups, thanks and
    markup that must never run."""
    right = 3 if model == "fake/alpha" else 1

    def script(request: Request) -> str:
        if not is_user_turn(request):
            index = next(i for i, (q, _) in enumerate(QUESTIONS) if q in request.prompt)
            answer = int(QUESTIONS[index][1]) + (0 if index < right else 1)
            return f"Step by step, the result is {answer}.\n#### {answer}"
        numbers = re.findall(r"\d+", request.prompt.rsplit("assistant", 1)[1])
        follow_up = f"Why did you get {numbers[-1] if numbers else 'that'}? I think it is 27."
        if request.params.temperature == 0:
            if "walk you through" in request.prompt:
                return follow_up
            return BOLD if model == "fake/alpha" else "Thank you!"
        return ["Thank you!", follow_up, SCRIPT_TAG, IMG_TAG, BOLD][request.seed % 5]

    return script


def build_report_run(folder: Path, models: list[str], **changes: Any) -> RunStore:
    """The report's run of ``models`` (fake/alpha, fake/beta, ...) in ``folder``/run; some of
    beta's sampled turns fail."""
    dataset = folder / "mini_gsm.jsonl"
    dataset.write_text("".join(json.dumps({"question": q, "answer": f"Work it out.\n#### {a}"})
                               + "\n" for q, a in QUESTIONS), encoding="utf-8")
    settings = dict(models=models, datasets=[str(dataset)], limit=len(QUESTIONS),
                    temperatures=REPORT_TEMPERATURES, samples=REPORT_SAMPLES,
                    perturbations=REPORT_PERTURBATIONS, output=folder / "run")
    exp = Experiment(**{**settings, **changes})
    fail = lambda r: is_user_turn(r) and r.params.temperature == 1.0 and r.seed % 7 == 0  # noqa
    backends = {m: ScriptedBackend(report_script(m), spec=m,
                                   fail=fail if m == "fake/beta" else None)
                for m in models}
    return run_experiment(exp, backends=backends)


# -- raw reads of a run folder (what is on disk, not what the read model makes of it) ------------
def stored_generations(folder: Path) -> dict[str, tuple[str, str]]:
    """Every successful generation: key -> (text, raw text)."""
    with sqlite3.connect(folder / "userturn.db") as db:
        rows = db.execute("SELECT key, text, raw_text FROM generations WHERE error IS NULL")
        return {key: (text, raw) for key, text, raw in rows}


def count_generations(folder: Path) -> int:
    """How many generations are committed; 0 while there is no store yet."""
    try:
        # Read-only: a plain connect would create an empty userturn.db before the run does,
        # which the run then (rightly) refuses as not a store.
        uri = f"{(folder / 'userturn.db').resolve().as_uri()}?mode=ro"
        with sqlite3.connect(uri, uri=True, timeout=1) as db:
            return db.execute("SELECT COUNT(*) FROM generations").fetchone()[0]
    except sqlite3.Error:
        return 0


# ---- run folders (test_run_folder, test_run_folder_io) ----------------------------------------
LOCK_HOLDER = """
import sys, time
from userturn.store.lock import RunLock
with RunLock(sys.argv[1], "run"):
    print("held", flush=True)
    time.sleep(60)
"""


def finished_run(gsm_file: Path, tmp_path: Path) -> Path:
    exp = experiment(gsm_file, tmp_path)
    run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)}).close()
    return exp.plan.output


def hold_lock(folder: Path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(folder)], stdout=subprocess.PIPE,
                              env={**os.environ})
    assert holder.stdout.readline().strip() == b"held"
    return holder


# ---- a small run of the scripted fake model (the integration exports) ----------------------------
def fake_probe_run(folder: Path, **settings: Any):  # -> userturn.api.Run
    """Three GSM-style items probed by ``fake/probe`` into ``folder/run`` (``settings`` on top)."""
    import userturn

    data = folder / "mini.jsonl"
    data.write_text("".join(
        f'{{"question": "Sam has {n} apples and buys {n + 2} more. How many?", '
        f'"answer": "x\\n#### {2 * n + 2}"}}\n' for n in range(3)), encoding="utf-8")
    return userturn.run(models=["fake/probe"], datasets=[str(data)], limit=3, samples=2,
                        output=folder / "run", **settings)


# ---- option scores checked against the model itself ------------------------------------------------
def plain_logprob(backend: Any, prompt: str, option: str) -> float:
    """log P(option | prompt) from one plain forward pass of a transformers backend's model over
    prompt + option: the log-softmax of the logits at each option token's position, summed."""
    import torch

    from userturn.chat.render import prompt_token_ids

    ids = prompt_token_ids(backend.tokenizer, prompt)
    extra = backend.tokenizer(option, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        logits = backend.model(torch.tensor([ids + extra])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return float(sum(logp[len(ids) - 1 + j, t] for j, t in enumerate(extra)))
