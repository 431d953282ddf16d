"""The ``userturn`` command line: the one parser (every command, in the order ``--help`` lists
them) and the one exit policy (how each way a command can end becomes an exit code and at most
one line on stderr).

The handlers only turn arguments into calls and print what the calls return: the core commands'
in :mod:`.commands`, the others beside their arguments (:mod:`.train`, :mod:`.labels`,
:mod:`.integrations`). The work is in the packages that own it.
"""

from __future__ import annotations

import argparse
import errno
import signal
import sys
import threading
import warnings
from typing import Sequence

from userturn.backends.models import EMBEDDED
from userturn.cli import arguments, commands
from userturn.cli.console import plain_console
from userturn.cli.integrations import add_integration_parsers
from userturn.cli.labels import add_classifier_parsers
from userturn.cli.signals import (
    INTERRUPTED,
    TERMINATED,
    finish_in_flight,
    stop_on_sigterm,
)
from userturn.cli.train import add_train_parser, train_command
from userturn.credentials import ScrubbedStream
from userturn.errors import Terminated, UserturnError


def parser() -> argparse.ArgumentParser:
    """Every ``userturn`` command, each with its handler (``args.handler(args, console)``)."""
    models = "; ".join(f"{name}: {text}" for name, text in EMBEDDED.items())
    parser = argparse.ArgumentParser(
        prog="userturn",
        description="The user-turn generation probe: after [user query, assistant answer], open a "
                    "USER turn in the model's own chat template, let the model write it, and "
                    "measure how often it is a genuine follow-up.",
        epilog=f"Embedded offline models: {models}. Any local model folder or hub id works too.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    arguments.add_run(sub, commands.run)
    arguments.add_judge(sub, commands.judge)
    arguments.add_render(sub, commands.render)
    arguments.add_datasets(sub, commands.datasets)
    arguments.add_report(sub, commands.report)
    arguments.add_annotate(sub, commands.annotate)
    arguments.add_agreement(sub, commands.agreement)
    arguments.add_compare(sub, commands.compare)
    arguments.add_export(sub, commands.export)
    arguments.add_doctor(sub, commands.doctor)
    add_train_parser(sub, train_command)
    add_classifier_parsers(sub)
    add_integration_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Everything the command prints (tables, warnings, error lines, a traceback) passes the
    # credentials scrubber: a key a server echoed back never reaches a terminal or a CI log.
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = ScrubbedStream(out), ScrubbedStream(err)
    before = set(threading.enumerate())
    try:
        code = _main(argv)
        if code in (INTERRUPTED, TERMINATED):
            finish_in_flight(before, code)
        return code
    finally:
        sys.stdout, sys.stderr = out, err


def _main(argv: Sequence[str] | None) -> int:
    """Parse, run the command's handler, and end it by the exit policy:

    - the handler's own code when it returns (0, or 1 for ``doctor``'s findings);
    - misuse, a refused or damaged store, every request failed (a ``UserturnError``; ``store/``
      raises its faults as ``StoreError``): one line, the error's ``exit_code`` (2; 1 when every
      request failed);
    - SIGTERM 143 and Ctrl-C 130, each with the line that says what is kept;
    - a path with a name longer than the file system takes: one line, 2;
    - anything else is a bug: its traceback, 1.
    """
    args = parser().parse_args(argv)
    console = plain_console()
    formatwarning, warnings.formatwarning = warnings.formatwarning, _one_line_warning
    on_sigterm = stop_on_sigterm()
    try:
        arguments.check_path_names(args)
        return args.handler(args, console)
    except UserturnError as exc:
        # One plain line (no wrapping), so it reads well and greps well.
        return _say(f"error: {' '.join(str(exc).split())}", exc.exit_code)
    except Terminated:
        return _say("terminated (SIGTERM); everything received so far is stored: run the same "
                    "command again to resume", TERMINATED)
    except KeyboardInterrupt:
        return _say("interrupted; everything finished so far is stored: run the same command "
                    "again to resume", INTERRUPTED)
    except Exception as exc:  # a bug: the traceback, through the scrubbing stderr
        if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:  # a name, not a bug
            return _say(f"error: {exc.filename}: a name in this path is longer than the file "
                        "system takes (255 bytes); choose a shorter one", 2)
        import traceback

        traceback.print_exc()
        return 1
    finally:
        warnings.formatwarning = formatwarning
        if on_sigterm is not None:
            signal.signal(signal.SIGTERM, on_sigterm)


def _say(line: str, code: int) -> int:
    print(f"userturn: {line}", file=sys.stderr)
    return code


def _one_line_warning(message, category, filename, lineno, line=None) -> str:  # type: ignore[no-untyped-def]
    return f"userturn: warning: {' '.join(str(message).split())}\n"


if __name__ == "__main__":
    sys.exit(main())
