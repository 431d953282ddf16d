"""Bridges to the tools researchers already use (docs/integrations.md).

- :mod:`.lmeval`: the user-turn pass as an lm-evaluation-harness task; :mod:`.lmeval_import`:
  its samples back into a run folder.
- :mod:`.inspect_log`: a run as an Inspect log; :mod:`.inspect_scorer`: our labels as an
  Inspect scorer (public as ``userturn.inspect``).
- :mod:`.hf`: a run, or the shipped labelled corpus, as a Hugging Face dataset folder with a card.

Each library is an optional extra, imported only by the call that needs it.
"""
