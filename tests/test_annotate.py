"""The human annotation page: the stratified sample, the JSON API, and the page in a real browser."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    ANNOTATION_ITEMS,
    ANNOTATION_SAMPLES,
    MARKUP_PAYLOAD,
    annotation_run,
    call_api,
    human_labels,
)

from userturn.labels.annotate import DEFINITIONS, AnnotationError, AnnotationServer, build_sample
from userturn.records import LABELS, Label
from userturn.store.database import RunStore
from userturn.store.rows import LabelRow
from userturn.store.turns import read_turns

TURNS = ANNOTATION_ITEMS * (1 + ANNOTATION_SAMPLES)


def set_strata(folder: Path, labels: list[str | None]) -> list[str]:
    """Give the user turns labels of a test source, in user_turns order; returns the keys."""
    store = RunStore.open(folder)
    keys = [t.key for t in read_turns(store)]
    store.put_labels([LabelRow(k, "t", Label(lab, source="strata"))
                      for k, lab in zip(keys, labels)])
    store.close()
    return keys


# -- build_sample ------------------------------------------------------------------------------
def test_sample_contains_the_rare_label_and_allocates_evenly(gsm_file, tmp_path):
    folder = annotation_run(gsm_file, tmp_path)
    labels: list[str | None] = ["generic"] * (TURNS - 4) + [None] * 3 + ["meta"]
    keys = set_strata(folder, labels)
    by_key = dict(zip(keys, labels))
    store = RunStore.open(folder)
    sample = build_sample(read_turns(store, "strata"), size=3, seed=0)
    assert keys[-1] in sample  # the single meta turn
    assert Counter(by_key[k] for k in sample) == {"generic": 1, None: 1, "meta": 1}
    sample = build_sample(read_turns(store, "strata"), size=10, seed=0)
    # meta and undecided are exhausted; their unused slots go to the large stratum
    assert Counter(by_key[k] for k in sample) == {"generic": 6, None: 3, "meta": 1}
    # strata interleave: the rare ones are not all at the end
    assert sample != sorted(sample, key=lambda k: by_key[k] is None)


def test_sample_is_deterministic_per_seed(gsm_file, tmp_path):
    store = RunStore.open(annotation_run(gsm_file, tmp_path))
    first = build_sample(read_turns(store, "rules"), size=8, seed=3)
    assert build_sample(read_turns(store, "rules"), size=8, seed=3) == first
    assert any(build_sample(read_turns(store, "rules"), size=8, seed=s) != first for s in range(4, 9))


def test_sample_size_bounds(gsm_file, tmp_path):
    store = RunStore.open(annotation_run(gsm_file, tmp_path))
    everything = build_sample(read_turns(store, "rules"), size=1000, seed=0)
    assert len(everything) == len(set(everything)) == TURNS
    assert set(everything) == {t.key for t in read_turns(store)}
    assert len(build_sample(read_turns(store, "rules"), size=1, seed=0)) == 1
    with pytest.raises(ValueError):
        build_sample(read_turns(store, "rules"), size=0)


def test_failed_generations_are_not_sampled(gsm_file, tmp_path):
    fail = lambda r: r.prompt.endswith("user\n") and r.params.temperature == 0  # noqa: E731
    store = RunStore.open(annotation_run(gsm_file, tmp_path, fail=fail))
    sample = build_sample(read_turns(store, "rules"), size=100, seed=0)
    failed = {t.key for t in read_turns(store) if t.error is not None}
    assert len(failed) == ANNOTATION_ITEMS and not failed & set(sample) and len(sample) == TURNS - ANNOTATION_ITEMS


# -- the JSON API --------------------------------------------------------------------------------
def test_page_is_self_contained_and_blind(gsm_file, tmp_path):
    folder = annotation_run(gsm_file, tmp_path)
    with AnnotationServer(folder, "ann", size=5, seed=1) as server:
        status, page = call_api(server, "/")
        assert status == 200 and "<script nonce=" in page
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
        status, data = call_api(server, "/api/next")
        assert set(data["item"]) == {"key", "query", "answer", "user_turn"}
        assert data["item"]["query"].endswith("?") and "#### 42" in data["item"]["answer"]
        text = json.dumps(data)
        for secret in ("fake/scripted", "temperature", "rules", *LABELS):
            assert secret not in text
        # Conditions of 6 and 12 turns: no sample can give either a corrected rate (30 labels
        # of its own), so the page promises none; conditions are numbered, never named.
        progress = data["progress"]
        assert (progress["done"], progress["total"], progress["to_correction"]) == (0, 5, 0)
        assert progress["short"] == len(progress["conditions"]) == 2
        assert sum(c["planned"] for c in progress["conditions"]) == 5
        assert all(c["needed"] == 30 and c["done"] == 0 for c in progress["conditions"])


def test_label_undo_and_validation(gsm_file, tmp_path):
    folder = annotation_run(gsm_file, tmp_path)
    with AnnotationServer(folder, "ann", size=4, seed=2) as server:
        first = call_api(server, "/api/next")[1]["item"]
        assert call_api(server, "/api/label", {"key": first["key"], "label": "nope"})[0] == 400
        assert call_api(server, "/api/label", {"key": "0" * 64, "label": "meta"})[0] == 400
        assert call_api(server, "/api/label", {"key": ["x"], "label": "meta"})[0] == 400
        assert call_api(server, "/api/label", {"key": first["key"], "label": "meta", "note": 3})[0] == 400
        assert call_api(server, "/api/undo", {})[1]["undone"] is None
        status, data = call_api(server, "/api/label",
                            {"key": first["key"], "label": "meta", "note": " odd "})
        assert status == 200 and data["progress"]["done"] == 1
        assert data["item"]["key"] != first["key"]
        assert human_labels(folder, "ann") == {first["key"]: ("meta", "odd", "human")}
        second = data["item"]
        call_api(server, "/api/label", {"key": second["key"], "label": "generic"})
        status, data = call_api(server, "/api/undo", {})
        assert data["undone"] == {"key": second["key"], "label": "generic", "note": ""}
        assert data["item"] == second and data["progress"]["done"] == 1
        assert set(human_labels(folder, "ann")) == {first["key"]}
        progress = call_api(server, "/api/progress")[1]
        assert (progress["done"], progress["total"], progress["to_correction"]) == (1, 4, 0)
        assert sum(c["done"] for c in progress["conditions"]) == 1


def test_foreign_hosts_origins_and_forms_are_refused(gsm_file, tmp_path):
    with AnnotationServer(annotation_run(gsm_file, tmp_path), "ann", size=2) as server:
        key = call_api(server, "/api/next")[1]["item"]["key"]
        body = {"key": key, "label": "meta"}
        assert call_api(server, "/api/next", headers={"Host": "evil.example"})[0] == 403
        local = server.host.replace("127.0.0.1", "localhost")
        assert call_api(server, "/api/progress", headers={"Host": local})[0] == 200
        assert call_api(server, "/api/label", body, {"Origin": f"http://{local}"})[0] == 403
        assert call_api(server, "/api/label", body, {"Origin": "http://evil.example"})[0] == 403
        assert call_api(server, "/api/label", body, {"Content-Type": "text/plain"})[0] == 415
        assert call_api(server, "/api/nothing")[0] == 404
        assert human_labels(server.folder, "ann") == {}
        assert server.url.startswith("http://127.0.0.1:")


def test_reopening_continues_the_same_sample_until_done(gsm_file, tmp_path):
    folder = annotation_run(gsm_file, tmp_path)
    with AnnotationServer(folder, "ann", size=3, seed=5) as server:
        keys = list(server.keys)
        first = call_api(server, "/api/next")[1]["item"]["key"]
        call_api(server, "/api/label", {"key": first, "label": "empty"})
    with AnnotationServer(folder, "ann") as server:  # size and seed come from the store
        assert server.keys == keys
        data = call_api(server, "/api/next")[1]
        assert (data["progress"]["done"], data["progress"]["total"]) == (1, 3)
        assert data["progress"]["to_correction"] == 0 and data["item"]["key"] == keys[1]
        for _ in range(2):
            data = call_api(server, "/api/label", {"key": data["item"]["key"], "label": "generic"})[1]
        assert data["done"] and data["item"] is None and data["progress"]["done"] == 3
    assert RunStore.open(folder).meta().annotation_samples["ann"].keys == keys
    with pytest.raises(AnnotationError, match="seed"):
        AnnotationServer(folder, "ann", size=3, seed=6)
    with pytest.raises(AnnotationError):
        AnnotationServer(folder, "bad name!")
    with pytest.raises(AnnotationError, match="at least 1"):
        AnnotationServer(folder, "carol", size=0)
    with AnnotationServer(folder, "other", size=3, seed=6) as other:  # each annotator their own
        assert call_api(other, "/api/progress")[1]["done"] == 0


# -- the page in a real browser ------------------------------------------------------------------


def open_page(browser: Any, server: AnnotationServer) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_default_timeout(10_000)
    page.goto(server.url)
    return page, errors


def progress_text(done: int, total: int) -> str:
    """The page's progress line: labels done of the sample (the plan's line is beside it)."""
    return f"{done} / {total}"


def test_page_in_headless_chromium(browser, gsm_file, tmp_path):
    from playwright.sync_api import expect

    folder = annotation_run(gsm_file, tmp_path)
    with AnnotationServer(folder, "alice", size=100, seed=0) as server:
        page, errors = open_page(browser, server)
        expected = drive_page(page, expect, server, tmp_path)
        page.close()
    assert errors == []
    assert human_labels(folder, "alice") == expected


def test_done_screen_and_ctrl_z(browser, gsm_file, tmp_path):
    from playwright.sync_api import expect

    with AnnotationServer(annotation_run(gsm_file, tmp_path), "bob", size=2, seed=0) as server:
        page, errors = open_page(browser, server)
        expect(page.locator("#progress")).to_have_text("0 / 2")
        # A 6-turn greedy row and a 12-turn one can never have a corrected rate: the page says
        # so instead of counting toward one.
        expect(page.locator("#plan-line")).to_contain_text("cannot reach 30 labels")
        expect(page.locator("#plan-line")).not_to_contain_text("more labels")
        page.keyboard.press("1")
        expect(page.locator("#progress")).to_have_text("1 / 2")
        page.keyboard.press("4")
        expect(page.locator("#done")).to_be_visible()
        expect(page.locator("#work")).to_be_hidden()
        page.keyboard.press("Control+z")
        expect(page.locator("#work")).to_be_visible()
        expect(page.locator("#progress")).to_have_text("1 / 2")
        assert list(human_labels(server.folder, "bob").values()) == [("follow_up", "", "human")]
        page.close()
    assert errors == []


def drive_page(page: Any, expect: Any, server: AnnotationServer,
               tmp_path: Path) -> dict[str, tuple[str, str, str]]:
    """Label three items (click, digit key, note + key), undo the third, label it again."""
    total = len(server.keys)
    expect(page.locator("#progress")).to_have_text(progress_text(0, total))
    for name in LABELS:
        expect(page.get_by_text(DEFINITIONS[name], exact=True)).to_be_visible()

    def shown() -> dict[str, str]:  # the page shows the next unlabelled item of the sample
        item = call_api(server, "/api/next")[1]["item"]
        assert page.locator("#turn").text_content() == item["user_turn"]
        assert page.locator("#query").text_content() == item["query"]
        return item

    expected: dict[str, tuple[str, str, str]] = {}
    first = shown()
    assert MARKUP_PAYLOAD in first["user_turn"]  # untrusted markup is shown as text, not run
    page.screenshot(path=str(tmp_path / "annotate.png"), full_page=True)
    shutil.copy(tmp_path / "annotate.png", "/tmp/annotate.png")
    page.locator("button[data-label=follow_up]").click()
    expect(page.locator("#progress")).to_have_text(progress_text(1, total))
    expected[first["key"]] = ("follow_up", "", "human")

    second = shown()
    page.keyboard.press("2")
    expect(page.locator("#progress")).to_have_text(progress_text(2, total))
    expected[second["key"]] = ("generic", "", "human")

    third = shown()
    note = "unsure; 1234567 u <b>x</b>"  # digits and u in the note must not label or undo
    page.locator("#note").click()
    page.keyboard.type(note)
    expect(page.locator("#progress")).to_have_text(progress_text(2, total))
    page.keyboard.press("Escape")
    page.keyboard.press("6")
    expect(page.locator("#progress")).to_have_text(progress_text(3, total))
    assert human_labels(server.folder, "alice")[third["key"]] == ("meta", note, "human")
    assert page.locator("#note").input_value() == ""

    page.keyboard.press("u")
    expect(page.locator("#progress")).to_have_text(progress_text(2, total))
    expect(page.locator("#status")).to_contain_text("Undone: meta")
    assert third["key"] not in human_labels(server.folder, "alice")
    assert page.locator("#turn").text_content() == third["user_turn"]
    assert page.locator("#note").input_value() == note  # the note comes back with the item
    page.locator("button[data-label=new_query]").click()
    expect(page.locator("#progress")).to_have_text(progress_text(3, total))
    expected[third["key"]] = ("new_query", note, "human")

    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.locator("img").count() == 0
    assert "<script>window.__pwned=1</script>" in page.locator("#turn").inner_text()
    return expected
