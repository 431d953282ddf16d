"""Datasets from the Hugging Face hub: one loader, and one one-line error for every way it fails."""

from __future__ import annotations

from typing import Any

from userturn.errors import DatasetError


def hub_rows(
    dataset: str, hub_name: str, split: str, hint: str, config: str | None = None
) -> tuple[Any, str]:
    """The rows of ``hub_name`` (``config``) ``split``, and how messages name them
    (``openai/gsm8k main/test``). Imports ``datasets`` lazily; ``dataset`` is the userturn name an
    error gives, and ``hint`` (the offline alternative) ends every error."""
    try:
        import datasets
    except ImportError:
        raise DatasetError(
            f"{dataset} needs the 'datasets' package (pip install 'userturn[hub]'), which is not "
            f"installed; {hint}"
        ) from None
    part = f"{config}/{split}" if config else split
    names = (hub_name, config) if config else (hub_name,)
    try:
        rows = datasets.load_dataset(*names, split=split)
    except Exception as error:  # noqa: BLE001 - the hub fails in many ways; all mean "unavailable"
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise DatasetError(
            f"cannot load {hub_name} ({part}) from the Hugging Face hub: {reason}; {hint}"
        ) from None
    return rows, f"{hub_name} {part}"
