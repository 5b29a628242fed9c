"""Executors run the stages' units of work: ``local`` (a process pool, the default) or ``ray``."""

from __future__ import annotations

from .base import Executor
from .local import LocalExecutor

EXECUTORS = ("local", "ray")


def make_executor(name: str, workers: int = 1, ray_address: str | None = None) -> Executor:
    """The executor called ``name``; Ray is imported only when asked for (omnipack's ``ray`` extra)."""
    if name == "local":
        return LocalExecutor(workers)
    if name == "ray":
        from .ray import RayExecutor

        return RayExecutor(workers, ray_address)
    raise ValueError(f"executor must be one of {EXECUTORS}, got {name!r}")


__all__ = ["EXECUTORS", "Executor", "LocalExecutor", "make_executor"]
