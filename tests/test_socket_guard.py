"""The autouse guard of conftest: tests reach 127.0.0.1 and nothing else."""

from __future__ import annotations

import socket
import threading

import pytest
from conftest import NetworkUse


def test_a_connection_off_this_machine_fails_at_once():
    with pytest.raises(NetworkUse, match="127.0.0.1 only"):
        socket.create_connection(("192.0.2.1", 80), timeout=5)  # TEST-NET-1: never routed
    with socket.socket() as sock, pytest.raises(NetworkUse):
        sock.connect_ex(("example.com", 443))


def test_a_local_server_is_reachable():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted = threading.Thread(target=lambda: server.accept()[0].close())
    accepted.start()
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    accepted.join(5)
    server.close()
