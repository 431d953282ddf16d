"""Backends with injected faults, built inside Ray actors by BackendSpec(factory=...): they
generate what the scripted backend does, except when told to die or hang. A marker file (shared
by every process on this machine) makes a fault happen once, across actor restarts."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Sequence

from userturn.backends import BackendSpec
from userturn.backends.fake import USER_HEADER, ScriptedBackend, probe_script
from userturn.records import Generation, Request


class FaultyBackend:
    def __init__(self, spec: BackendSpec, fault: str) -> None:
        self.base = ScriptedBackend(probe_script, spec=spec.spec, chunk_size=spec.batch_size)
        self.spec, self.revision, self.template = self.base.spec, self.base.revision, self.base.template
        self.chunk_size, self.fault, self.args = self.base.chunk_size, fault, dict(spec.backend_args)

    def complete(self, requests: Sequence[Request]) -> list[Generation]:
        marker = Path(self.args["marker"])
        if self.fault == "poison" and any(self.args["poison"] in r.prompt for r in requests):
            with marker.open("a") as log:
                log.write("died\n")
            os._exit(1)  # every time: this unit can never finish
        user_unit = any(r.prompt.endswith(USER_HEADER) for r in requests)
        if self.fault in ("die", "hang") and user_unit and not marker.exists():
            self.base.complete(requests[: len(requests) // 2])  # half the unit is done...
            marker.write_text(f"{self.fault} in process {os.getpid()}\n")
            if self.fault == "die":
                os._exit(1)  # ...and lost with the process, as in an OOM kill
            time.sleep(3600)  # ...and the rest never comes
        return self.base.complete(requests)


def dying(spec: BackendSpec) -> FaultyBackend:
    return FaultyBackend(spec, "die")


def hanging(spec: BackendSpec) -> FaultyBackend:
    return FaultyBackend(spec, "hang")


def poisoned(spec: BackendSpec) -> FaultyBackend:
    return FaultyBackend(spec, "poison")
