"""How the CLI ends on a signal. SIGTERM stops a command as Ctrl-C does (every stage keeps what
it received); after either, requests already sent finish while Python waits for their threads,
and a second Ctrl-C or SIGTERM then exits at once, in one line."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable

from userturn.errors import Terminated

INTERRUPTED, TERMINATED = 130, 143  # the shell's codes for SIGINT and SIGTERM


def finish_in_flight(before: set[threading.Thread], code: int) -> None:
    """After an interrupt, what was received is stored; requests already sent (the judge's
    threads) still finish or time out, as Python waits for their threads before it exits. A
    second Ctrl-C or SIGTERM meanwhile means "now": one line, and exit at once, without the
    traceback Python would print from that wait."""
    if threading.current_thread() is not threading.main_thread():
        return
    pending = [thread for thread in threading.enumerate()
               if thread not in before and not thread.daemon and thread.is_alive()
               and thread is not threading.current_thread()]
    if not pending:
        return

    def now(signum: int, frame: object) -> None:
        print(f"userturn: interrupted again: exiting now without waiting for {len(pending)} "
              "request(s) in flight (asked again by the next run of the same command); "
              "everything received is stored", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(code)

    previous = {signum: signal.signal(signum, now) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        for thread in pending:
            while thread.is_alive():
                thread.join(0.1)  # short waits: the handler runs between them
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def stop_on_sigterm() -> signal.Handlers | Callable[..., object] | int | None:
    """SIGTERM is how ``kill``, ``timeout``, SLURM and ``docker stop`` end a job: raise
    :class:`Terminated` (a KeyboardInterrupt) so every stage keeps what it received as on Ctrl-C.
    Returns the handler it replaced (None where signals cannot be handled: not the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def terminate(signum: int, frame: object) -> None:
        # A second SIGTERM must not cut short the commit of what was received.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated

    return signal.signal(signal.SIGTERM, terminate)
