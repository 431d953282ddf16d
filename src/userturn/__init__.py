"""userturn: the user-turn generation probe of interaction awareness in chat models.

The Python API (docs/api.md)::

    import userturn
    run = userturn.run(models=["tiny"], limit=3, output="runs/try")   # or load_run("runs/demo")
    rows = run.summary()            # the table `userturn report` prints
    turns = run.turns()             # list of Turn: context, text, labels, status
    frame = run.to_pandas()         # the export's columns, one row per user turn
"""

from userturn.api import Run, classify, load_run, render_user_turn, run  # noqa: E402
from userturn.errors import UserturnError  # noqa: E402
from userturn.records import COLUMNS, Answer, Turn  # noqa: E402
from userturn.version import __version__  # noqa: E402

__all__ = ["COLUMNS", "Answer", "Run", "Turn", "UserturnError", "__version__", "classify", "load_run",
           "render_user_turn", "run"]
