"""The soak test at CI size (benchmarks/soak.py has the full one): SIGKILLs at random points of
a run under injected backend errors and exceptions, judge 429s, hangs and drops and a full disk,
and a SIGTERM while judging; afterwards nothing is lost or duplicated, every turn is judged once,
doctor passes and the readers wrote nothing into the run folder."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

# Child processes killed and resumed, a judge server: about a minute on 2 quiet cores, and the
# most load-sensitive test we have. `make test-slow` runs it (CI runs both).
pytestmark = pytest.mark.slow

SOAK = Path(__file__).resolve().parent.parent / "benchmarks" / "soak.py"


def test_a_small_soak_loses_and_duplicates_nothing(tmp_path):
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    figures = soak.soak(kills=3, items=8, samples=2, seed=1, workdir=tmp_path)
    assert figures["kills"] == 3
    assert figures["lost"] == 0 and figures["duplicated_or_extra"] == 0
    assert figures["changed"] == 0 and figures["expected"] == 8 * (2 + 2)
    assert figures["judged"] == figures["judged_expected"] == 8 * (1 + 2)
    assert figures["doctor_exit"] == 0 and figures["ok"], figures
    assert figures["sigterm_exit"] == 143 and figures["sigterm_verdicts_received"] > 0
    assert figures["sigterm_verdicts_lost"] == 0 and figures["sigterm_resume_exit"] == 0
    assert figures["reader_exits"] == [0, 0] and not figures["readers_wrote_into_the_run"]
