"""The few error types a user can cause. The CLI prints them as one line and exits 2."""


class UserturnError(Exception):
    """Misuse: a bad config, an unknown model, a missing file. Never a model's failure."""

    exit_code = 2


class ConfigError(UserturnError):
    """The experiment config or a CLI flag is invalid."""


class ModelError(UserturnError):
    """A model cannot be found or loaded."""


class TemplateError(UserturnError):
    """A chat template cannot render the probe (for example it cannot open a user turn)."""


class DatasetError(UserturnError):
    """A dataset cannot be found, read or parsed."""


class StoreError(UserturnError):
    """A run folder is unusable (for example it holds a run of a different experiment)."""


class DamagedStore(StoreError):
    """A run's database is damaged (malformed, truncated); ``detail`` is SQLite's own words."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


class RequestsFailed(UserturnError):
    """Every request a command sent failed (a server down, a wrong key): nothing was made."""

    exit_code = 1


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, SLURM preemption, ``docker stop``): the command stops as
    on Ctrl-C, so every stage keeps what it received the way it does for Ctrl-C."""
