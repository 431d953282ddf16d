"""userturn in Inspect: ``user_turn_label()``, a scorer that labels a sample's last user message
with userturn's labeller, ``follow_up_rate()``, its metric, and the model provider
``userturn/MODEL`` (``get_model("userturn/tiny")``), a simulated user that writes the next user
turn as the probe does (docs/integrations.md).

    from userturn.inspect import user_turn_label
    Task(dataset=..., solver=[..., simulate_user()], scorer=user_turn_label())

Needs the ``inspect`` extra: ``pip install 'userturn[inspect]'``.
"""

from __future__ import annotations

from userturn.errors import UserturnError

try:
    from userturn.integrations.inspect_model import SimulatedUser
    from userturn.integrations.inspect_scorer import (
        follow_up_rate,
        last_user_turn,
        user_turn_label,
    )
except ImportError as exc:
    if exc.name is None or not exc.name.startswith("inspect_ai"):
        raise
    raise UserturnError("userturn.inspect needs inspect_ai: pip install 'userturn[inspect]'"
                        ) from None

__all__ = ["SimulatedUser", "follow_up_rate", "last_user_turn", "user_turn_label"]
