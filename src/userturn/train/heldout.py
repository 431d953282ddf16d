"""A held-out rule set: a second, deliberately different labeller of follow-ups.

Training takes its signal from the rules classifier (``userturn.labels.rules``), so the before/after
measured by those same rules can be gamed. This labeller played no part in training and shares
no code with it: it looks only at surface evidence of a grounded follow-up, in the spirit of
labels.md, and says ``follow_up`` only when all of these hold:

1. there is visible text, no assistant role header follows it, and it does not talk as the
   assistant (a service phrase such as "anything else I can help with", or worked arithmetic
   with "="); else ``empty`` or ``assistant_drift``;
2. it does not restate the query (bag-of-words F1 with the query below 0.6; else
   ``restatement``);
3. it asks something: a question mark, or an opening interrogative or request word;
4. it is grounded: it names a number or a content word (4+ letters) that the answer has and the
   query does not, so it reacts to the answer rather than to the task;
5. it is not mostly the answer's own words (F1 with the answer below 0.6).

Everything else is left undecided, which counts as "not a follow-up" in rates (as undecided rules
labels do). It is coarse on purpose: agreement between two labellers built differently is the
evidence, not either one alone. Standard library only.
"""

from __future__ import annotations

import re
from collections import Counter

from userturn.records import Case, Label

_WORD = re.compile(r"[a-z]+|\d+(?:\.\d+)?")
_ASKS = re.compile(r"^\W*(why|how|what|which|when|where|who|whose|can|could|would|will|should|"
                   r"is|are|was|were|do|does|did|explain|show|tell|please|so|and|but|wait|if|"
                   r"isn't|aren't|shouldn't|wouldn't)\b", re.IGNORECASE)
_SERVICE = re.compile(r"anything else|can i help|i can help|happy to help|hope (this|that) helps|"
                      r"let me know|feel free|glad (i|to) help|you're welcome", re.IGNORECASE)
_COMMON = set("""that this with have from they their there what which would could should about
into than then them were been being also just only very more most some such your yours does
when where while will shall make made many much each other answer question thanks thank please
help explain""".split())


def _f1(a: list[str], b: list[str]) -> float:
    common = sum((Counter(a) & Counter(b)).values())
    if not common:
        return 0.0
    precision, recall = common / len(a), common / len(b)
    return 2 * precision * recall / (precision + recall)


def _evidence(words: list[str]) -> set[str]:
    return {w for w in words if w[0].isdigit() or (len(w) >= 4 and w not in _COMMON)}


class HeldOutRules:
    name = "heldout-rules"
    version = "1"

    def classify(self, case: Case) -> Label:
        text = case.user_turn.strip()
        header = case.assistant_header.strip()
        if header and header in case.raw_user_turn and case.raw_user_turn.split(header, 1)[1].strip():
            return self._label("assistant_drift", "the assistant header follows, with text")
        if not text:
            return self._label("empty", "no visible text")
        if _SERVICE.search(text) or "=" in text:
            return self._label("assistant_drift", "talks as the assistant")
        turn = _WORD.findall(text.lower())
        query, answer = _WORD.findall(case.query.lower()), _WORD.findall(case.answer.lower())
        if query and _f1(turn, query) >= 0.6:
            return self._label("restatement", "mostly the query's words")
        if "?" not in text and not _ASKS.match(text):
            return self._label(None, "asks nothing")
        grounded = _evidence(turn) & (_evidence(answer) - set(query))
        if not grounded:
            return self._label(None, "nothing from the answer that the query lacks")
        if answer and _f1(turn, answer) >= 0.6:
            return self._label(None, "mostly the answer's own words")
        return self._label("follow_up", f"asks about {', '.join(sorted(grounded)[:3])}")

    def _label(self, label: str | None, why: str) -> Label:
        return Label(label=label, source=self.name, rationale=why)  # type: ignore[arg-type]
