"""Collaboration-oriented post-training: ``userturn train sft|rl``, then the probe on the
checkpoint against its base. TRL and peft are imported only inside the trainers."""
