"""The probe on each dataset family, offline, through the real pipeline (scripted model)."""

from __future__ import annotations

import json

import pytest
from helpers import SHAREGPT_CONVERSATIONS, is_user_turn

from userturn import load_run
from userturn.backends.fake import ScriptedBackend
from userturn.cli.main import main
from userturn.config import Experiment
from userturn.probe.pipeline import run_experiment
from userturn.records import Request
from userturn.store.turns import read_answers, read_turns


def script(request: Request) -> str:
    if not is_user_turn(request):
        return "Here is my answer: 7."
    return "Why 7? I think it should be 8." if request.params.temperature > 0 else "Thanks!"


def run(tmp_path, dataset: str, **changes):
    exp = Experiment(models=["fake/scripted"], datasets=[dataset], limit=changes.pop("limit", 3),
                     temperatures=[0.0, 1.0], samples=2, output=tmp_path / "run", **changes)
    return run_experiment(exp, backends={"fake/scripted": ScriptedBackend(script)})


def test_sharegpt_file_with_data_answers_and_a_human_baseline(tmp_path):
    path = tmp_path / "chats.json"
    path.write_text(json.dumps(SHAREGPT_CONVERSATIONS))
    store = run(tmp_path, f"conversations:{path}", answerers=["self", "data"], skip_invalid=True)
    rows = load_run(store).summary()
    human = [row for row in rows if row.model == "human"]
    assert len(human) == 1 and human[0].turns == 2  # c3 has no next turn
    assert human[0].labels.get("follow_up") == 1 and human[0].labels.get("generic") == 1
    data_rows = [row for row in rows if row.answerer == "data" and row.model != "human"]
    assert data_rows and all(row.accuracy is None for row in rows)  # conversations: no accuracy
    assert all(row.similarity is not None for row in rows if row.model != "human")
    turns = {t.answer for t in read_turns(store) if t.answerer == "data"}
    assert "Put it in boiling water for 9 minutes, then cool it." in turns


def test_mtbench_offline_keeps_the_real_second_turn(tmp_path):
    pytest.importorskip("userturn.data.conversations")
    from userturn.data import load_dataset
    from userturn.errors import DatasetError

    try:
        load_dataset("mtbench", limit=1)
    except DatasetError as exc:
        pytest.skip(f"MT-Bench questions not installed: {exc}")
    store = run(tmp_path, "mtbench")
    rows = load_run(store).summary()
    assert {row.model for row in rows} == {"fake/scripted", "human"}
    human = next(row for row in rows if row.model == "human")
    assert human.turns == 3  # the real second turn of each of the 3 questions


def test_own_csv_file_with_a_field_mapping(tmp_path, capsys):
    path = tmp_path / "mine.csv"
    path.write_text("question,target\nWhat is 3+4?,7\nWhat is 2+2?,4\n,5\n")
    out = tmp_path / "own"
    # From the command line with the scripted fake/ backend: the blank row is skipped and counted.
    code = main(["run", "--model", "fake/scripted", "--dataset", str(path), "--field",
                 "query=question", "--field", "answer=target", "--skip-invalid",
                 "--output", str(out)])
    assert code == 0 and "fake/scripted" in capsys.readouterr().out
    assert {row.items for row in load_run(out).summary()} == {2}
    store = run(tmp_path, str(path), fields={"query": "question", "answer": "target"},
                skip_invalid=True)
    (greedy, sampled) = load_run(store).summary()
    assert greedy.items == 2 and greedy.accuracy.hits == 1  # "7" right, "4" wrong


def test_malformed_own_file_stops_with_file_row_and_field(tmp_path, capsys):
    path = tmp_path / "mine.csv"
    path.write_text("question,target\nWhat is 3+4?,7\n,5\n")
    out = tmp_path / "bad"
    code = main(["run", "--model", "tiny", "--dataset", str(path), "--field", "query=question",
                 "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "mine.csv" in err and "line 3" in err and "query" in err
    assert not out.exists()


def test_ifbench_offline_with_instruction_accuracy(tmp_path):
    from userturn.data import load_dataset
    from userturn.errors import DatasetError

    try:
        load_dataset("ifbench", limit=1)
    except DatasetError as exc:
        pytest.skip(f"IFBench or its verifiers not installed: {exc}")
    store = run(tmp_path, "ifbench", limit=2)
    greedy = load_run(store).summary()[0]
    assert greedy.accuracy is not None and greedy.accuracy.n == 2
    details = store.db.execute("SELECT details FROM scores").fetchone()["details"]
    assert "prompt_loose" in json.loads(details)
    from rich.console import Console

    from userturn.report.summary import print_instruction_accuracy

    console = Console(record=True, width=200)
    print_instruction_accuracy(read_answers(store), console)
    text = console.export_text()
    assert "prompt strict" in text and "instruction loose" in text and "ifbench" in text
