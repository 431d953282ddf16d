"""The package's version: a module of its own, so that any stage can read it without importing
the package's public API (``userturn/__init__`` imports every stage)."""

__version__ = "0.1.0"
