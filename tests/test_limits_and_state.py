"""Numbers are checked before anything runs, a prompt too long for the model fails alone, a CSV
quote left open names its row, skipped rows are counted, and an interrupted run says so."""

from __future__ import annotations

import sqlite3
import warnings

import pytest
from helpers import (
    GSM_ITEMS,
    GSM_SAMPLES,
    experiment,
    is_user_turn,
    undecided_script,
)

from userturn.backends.fake import ScriptedBackend
from userturn.chat.render import prompt_token_ids
from userturn.cli.main import main
from userturn.data import files, load_dataset
from userturn.errors import DatasetError
from userturn.probe.pipeline import run_experiment
from userturn.records import GenerationParams, Request
from userturn.store.database import RunStore


@pytest.mark.parametrize("flag, value, words", [
    ("--temperatures", "nan", "temperatures must be numbers from 0 (greedy) to 10, got nan"),
    ("--temperatures", "0,inf", "got inf"),
    ("--temperatures", "1e308", "got 1e+308"),
    ("--limit", str(10 ** 12), "invalid config (limit): Input should be less than or equal to"),
    ("--max-tokens", str(10 ** 9), "invalid config (max_tokens)"),
    ("--samples", str(10 ** 9), "invalid config (samples)"),
])
def test_out_of_range_numbers_are_one_line_and_write_nothing(flag, value, words, tmp_path,
                                                             capsys):
    out = tmp_path / "run"
    assert main(["run", "--model", "tiny", flag, value, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and words in err, err
    assert not out.exists()


def test_a_prompt_too_long_for_the_context_fails_alone_and_budgets_are_clamped(tiny_backend):
    params = GenerationParams(0.0, 1.0, 8)
    long = Request("word " * 3000, params, ("<|im_end|>",))  # past the tiny model's 2048
    short = [Request(f"Hello {n}", params, ("<|im_end|>",)) for n in range(3)]
    out = tiny_backend.complete([short[0], long, short[1], short[2]])
    assert [g.error is None for g in out] == [True, False, True, True]
    assert "more than the model's context of 2048" in out[1].error
    # A budget past the context is clamped to what is left, with one warning.
    tokenizer = tiny_backend.tokenizer
    text = tokenizer.decode(tokenizer("word " * 3000, add_special_tokens=False)["input_ids"][:2030])
    size = len(prompt_token_ids(tokenizer, text))
    assert 2000 < size < 2048
    near = Request(text, GenerationParams(0.0, 1.0, 10 ** 6), ("<|im_end|>",))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (done,) = tiny_backend.complete([near])
    assert done.error is None and done.completion_tokens <= 2048 - size
    assert any("runs past the model's context" in str(w.message) for w in caught)


@pytest.mark.parametrize("batching", ["refill", "static"])
def test_a_batch_that_fails_as_a_whole_is_retried_one_by_one(batching, tiny_backend,
                                                              monkeypatch):
    import userturn.backends.hf as hf

    failure = RuntimeError("DefaultCPUAllocator: can't allocate memory")
    long_ids = tuple(prompt_token_ids(tiny_backend.tokenizer, "LONG"))
    if batching == "refill":  # the engine's loop over rows, refilled as they finish
        generate_rows = hf.generate_rows

        def rows_fail_with_the_long_one(model, rows, *args, **kwargs):  # type: ignore[no-untyped-def]
            if any(row.ids == long_ids for row in rows):
                raise failure
            return generate_rows(model, rows, *args, **kwargs)

        monkeypatch.setattr(hf, "generate_rows", rows_fail_with_the_long_one)
    else:  # left-padded static batches through generate
        run = type(tiny_backend)._run

        def fails_with_the_long_one(self, requests, encoded, params, stop):  # type: ignore[no-untyped-def]
            if any("LONG" in r.prompt for r in requests):
                raise failure
            return run(self, requests, encoded, params, stop)

        monkeypatch.setattr(type(tiny_backend), "_run", fails_with_the_long_one)
    monkeypatch.setattr(tiny_backend, "batching", batching)
    params = GenerationParams(0.0, 1.0, 4)
    batch = [Request(text, params, ("<|im_end|>",)) for text in ("a", "LONG", "b", "c")]
    out = tiny_backend.complete(batch)
    assert [g.error is None for g in out] == [True, False, True, True]
    assert "can't allocate" in out[1].error


def test_an_unterminated_csv_quote_names_its_row(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text('question,answer\nfirst?,1\n"second,2\nthird?,3\nfourth?,4\n')
    with pytest.raises(DatasetError, match=r"line 3.*quoted field is never closed"):
        files.file_items(path)
    kept = files.file_items(path, skip_invalid=True)
    assert [i.messages[-1]["content"] for i in kept.items] == ["first?"]
    assert kept.skipped_count == 1
    # The quote opens the first data row: the error is that row's, not "no query column".
    path.write_text('question,answer\n"first?,1\nsecond?,2\n')
    for skip in (False, True):
        with pytest.raises(DatasetError, match=r"line 2.*quoted field is never closed"):
            files.file_items(path, skip_invalid=skip)


def test_skipped_rows_are_counted_in_the_metadata_and_the_summary(tmp_path, capsys):
    path = tmp_path / "data.csv"
    path.write_text("question,answer\nfirst?,1\n,2\nthird?,3\n,4\n")
    out = tmp_path / "run"
    code = main(["run", "--model", "tiny", "--dataset", str(path), "--skip-invalid",
                 "--temperatures", "0", "--max-tokens", "4", "--user-max-tokens", "4",
                 "-o", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "rows skipped at load (invalid, counted in the run's metadata): data: 2" in printed.out
    assert RunStore.open(out).meta().skipped == {"data": 2}


def test_gsm_symbolic_limit_is_clamped_with_a_warning(monkeypatch):
    import userturn.data as data

    monkeypatch.setattr(data, "GSM_SYMBOLIC_MAX", 3)
    with pytest.warns(UserWarning, match="using 3"):
        dataset = load_dataset("gsm_symbolic", limit=10 ** 12)
    assert len(dataset.items) == 3


def test_an_interrupted_run_is_shown_incomplete_in_every_reader(gsm_file, tmp_path, capsys):
    exp = experiment(gsm_file, tmp_path)
    run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)}).close()
    calls = []

    def killed(request):  # the second run (more samples) dies after a few user turns
        if is_user_turn(request):
            calls.append(request)
            if len(calls) > 3:
                raise KeyboardInterrupt
        return undecided_script(request)

    more = experiment(gsm_file, tmp_path, samples=GSM_SAMPLES + 2)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(more, backends={more.plan.models[0]: ScriptedBackend(killed, chunk_size=1)})
    planned = GSM_ITEMS * (1 + GSM_SAMPLES + 2)
    assert main(["report", str(more.plan.output)]) == 0
    out = capsys.readouterr().out
    assert "incomplete run: assistant turns 6 of 6 stored, user turns" in out
    assert f"of {planned} stored" in out and "run the same command again to resume" in out
    assert main(["report", str(more.plan.output), "--html"]) == 0
    capsys.readouterr()
    html = (more.plan.output / "report.html").read_text()
    assert "incomplete run" in html and "Run finished" not in html
    assert main(["doctor", str(more.plan.output)]) == 0
    assert "incomplete run" in capsys.readouterr().out
    with sqlite3.connect(more.plan.output / "userturn.db") as db:
        stored = db.execute("SELECT COUNT(*) FROM plan p JOIN generations g ON g.key = p.key "
                            "WHERE p.role = 'user'").fetchone()[0]
    assert f"user turns {stored} of {planned} stored" in out
