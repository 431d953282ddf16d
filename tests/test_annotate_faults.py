"""The annotation server under a careless client: a port in use stores nothing, a bad
Content-Length is a 400 without internals, a body cut short is never applied."""

from __future__ import annotations

import json
import socket

import pytest
from test_annotate import call, human_labels, make_run

from userturn.cli.main import main
from userturn.labels.annotate import AnnotationServer
from userturn.store.database import RunStore


def raw_post(server: AnnotationServer, path: str, headers: dict[str, str], body: bytes) -> bytes:
    """Send a hand-made request, then hang up our side; the server's answer (maybe none)."""
    host, port = server.host.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        head = "".join(f"{k}: {v}\r\n" for k, v in {"Host": server.host,
                                                     "Content-Type": "application/json",
                                                     **headers}.items())
        sock.sendall(f"POST {path} HTTP/1.1\r\n{head}\r\n".encode() + body)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_a_port_in_use_is_one_line_and_stores_no_sample(gsm_file, tmp_path, capsys):
    folder = make_run(gsm_file, tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["annotate", str(folder), "--annotator", "ana", "--port", str(port),
                     "--no-browser"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.count("\n") == 0 and f"cannot listen on 127.0.0.1:{port}" in err
    assert "ana" not in RunStore.open(folder).meta().annotation_samples
    with AnnotationServer(folder, "ana", size=5) as server:  # a later --size is not refused
        assert len(server.keys) == 5


@pytest.mark.parametrize("length", ["abc", "-5", "1e3"])
def test_a_bad_content_length_is_a_400_without_internals(length, gsm_file, tmp_path):
    folder = make_run(gsm_file, tmp_path)
    with AnnotationServer(folder, "ana", size=4) as server:
        answer = raw_post(server, "/api/label", {"Content-Length": length}, b"{}")
    status, _, body = answer.partition(b"\r\n")
    assert b" 400 " in status
    assert b"Content-Length must be a byte count" in body and b"ValueError" not in body


def test_a_body_cut_short_is_never_applied(gsm_file, tmp_path):
    folder = make_run(gsm_file, tmp_path)
    with AnnotationServer(folder, "ana", size=4) as server:
        first = call(server, "/api/next")[1]["item"]["key"]
        body = json.dumps({"key": first, "label": "meta"}).encode()
        raw_post(server, "/api/label", {"Content-Length": str(len(body) + 40)}, body)
        assert human_labels(folder, "ana") == {}  # the cut label was not stored
        assert call(server, "/api/label", {"key": first, "label": "generic"})[0] == 200
        raw_post(server, "/api/undo", {"Content-Length": "50"}, b'{"')
        assert set(human_labels(folder, "ana")) == {first}  # the cut undo did not run
