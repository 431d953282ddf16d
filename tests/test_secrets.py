"""An API key never leaves the process: not in the store, the report, the exports, nor anything
printed, in any form a server may echo it (raw, JSON-escaped, URL-encoded, a partial prefix), and
also when the key in the environment carries a trailing CR/LF."""

from __future__ import annotations

import base64
import html
import json
import urllib.parse

import pytest
from openai_fake import Answer, Fail, FakeOpenAI, Recorded

from userturn import credentials
from userturn.cli.main import main
from userturn.store.turns import read_turns

KEY = "sk-proj-Zq7Lm2Vb9Tn4Wc8Rd1Ke6Hs3Yp5Xa0"
FORMS = {
    "raw": KEY,
    "json_escaped": "".join(f"\\u{ord(c):04x}" for c in KEY),
    "partly_escaped": KEY.replace("-", "\\u002D"),
    "url_encoded": urllib.parse.quote(KEY, safe="").replace("-", "%2d"),
    "partial_prefix": KEY[:12] + "*" * 20 + KEY[-4:],
    "last_12": "..." + KEY[-12:],
    "middle_slice": KEY[9:21],
    "upper_cased": KEY.upper(),
    "split_by_newline": KEY[:17] + "\n" + KEY[17:],
    "html_entities": "".join(f"&#{ord(c)};" if i % 2 else f"&#x{ord(c):x};"
                             for i, c in enumerate(KEY)),
    "base64_authorization": base64.b64encode(f"Authorization: Bearer {KEY}".encode()).decode(),
}
# Every 8-character piece of the key, and of its base64 at each of the three byte alignments.
PIECES = {form[i:i + credentials.MIN_PIECE].lower()
          for form in [KEY] + [base64.b64encode(KEY[a:].encode()).decode()[:-4]
                               for a in range(3)]
          for i in range(len(form) - credentials.MIN_PIECE + 1)}


def leaks(text: str) -> list[str]:
    """The forms of the key (and its leading characters) found in ``text``."""
    # (the base64 form opens with the header's name, not the key: its pieces are checked below)
    found = [name for name, form in FORMS.items() if form[:credentials.MIN_PARTIAL + 4] in text
             and not name.startswith("base64")]
    flat = text.replace("\r", "").replace("\n", "").replace("\\n", "").lower()
    flat += " " + html.unescape(flat)
    return found + (["piece"] if any(piece in flat for piece in PIECES) else [])


def responder(form: str):
    """Completions: the probe and assistant turns succeed (the answer echoes the key), greedy
    user turns echo it, sampled ones fail with it in the error body. Chat (the judge): every
    other verdict fails with a 401 echoing it, the rest echo it in the rationale."""
    chats = []

    def respond(request: Recorded):
        body = request.body
        if request.is_completion:
            if body["max_tokens"] in (1, 20):
                return Answer(content=f"It is 7, key {form}. #### 7")
            if body["temperature"] == 0:
                return Answer(content=f"Why {form}?")
            return Fail(400, body=json.dumps({"error": {"message": f"bad key {form}"}}))
        chats.append(request)
        if len(chats) % 2:
            return Fail(401, body=json.dumps({"error": {"message": f"Incorrect API key {form}"}}))
        verdict = {"label": "generic", "rationale": f"Mentions {form} only."}
        return Answer(content=json.dumps(verdict))
    return respond


@pytest.mark.parametrize("form", FORMS)
def test_the_key_in_every_form_reaches_no_stored_or_printed_text(form, tmp_path, capsys,
                                                                  monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY + "\r\n")  # as a Windows editor or `echo` leaves it
    run = tmp_path / "run"
    with FakeOpenAI() as fake:
        fake.responder = responder(FORMS[form])
        common = ["--base-url", fake.url, "--tokenizer", "tiny", "--limit", "2",
                  "--temperatures", "0,1", "--samples", "1", "--max-tokens", "20",
                  "--user-max-tokens", "12", "-o", str(run)]
        assert main(["run", "--model", "openai/served", *common]) == 0
        # The judge: some verdicts fail (401 echoing the key), some echo it in the rationale.
        code = main(["judge", str(run), "--judge", "openai/j", "--base-url", fake.url,
                     "--scope", "all"])
        assert code == 0
        # A refusal at start (one error line) echoes it too.
        fake.responder = lambda request: Fail(401, body=f'{{"error": "key {FORMS[form]}"}}')
        assert main(["run", "--model", "openai/other", *common[:-1], str(tmp_path / "r2")]) == 2
        sent = [r.headers.get("Authorization") for r in fake.requests]
    assert set(sent) == {f"Bearer {KEY}"}  # stripped: the header is valid and the key works
    assert main(["report", str(run), "--html"]) == 0
    assert main(["export", str(run), "--format", "csv"]) == 0
    assert main(["export", str(run), "--format", "jsonl"]) == 0
    printed = capsys.readouterr()
    assert leaks(printed.out + printed.err) == []
    files = [p for p in run.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"userturn.db", "report.html", "user_turns.csv"}
    for path in files:
        assert leaks(path.read_bytes().decode("latin-1")) == [], path
    # The echoes did arrive (so the test sees something to scrub): the store holds them redacted.
    from userturn.store.database import RunStore

    store = RunStore.open(run)
    texts = [t.user_turn for t in read_turns(store)] + [
        r["error"] or r["rationale"] for r in store.db.execute("SELECT * FROM labels WHERE "
                                                             "source LIKE 'judge:%'")]
    store.close()
    assert sum("[redacted]" in (t or "") for t in texts) >= 3


def test_scrub_reads_every_form_and_leaves_other_text():
    credentials.remember(KEY)
    for name, form in FORMS.items():
        scrubbed = credentials.scrub(f"a {form} b")
        assert "[redacted]" in scrubbed and not leaks(scrubbed), name
    assert credentials.scrub("sk-proj-Zq7") == "[redacted]"
    assert credentials.scrub("a plain sentence about sk and keys") == \
        "a plain sentence about sk and keys"


def test_a_key_with_a_newline_inside_is_one_error_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-abc\ndef-123456")
    code = main(["run", "--model", "openai/m", "--base-url", "http://127.0.0.1:9/v1",
                 "--tokenizer", "tiny", "-o", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().count("\n") == 0 and "control characters" in err
    assert "def-123456" not in err
