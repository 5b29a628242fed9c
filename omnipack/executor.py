"""Run a per-item stage function in input order, in this process or on a process pool.

The function is built once per process from plain data (``make_fn(context)``), so heavy state such as a
tokenizer is loaded once per worker and never pickled. Items are handed to the pool in bounded windows:
the input is never read far ahead of the output, so memory stays flat on large inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_FN: Callable[[Any], Any] | None = None  # this worker's function, built by the pool initializer


def _init(make_fn: Callable[[Any], Callable[[Any], Any]], context: Any) -> None:
    global _FN
    _FN = make_fn(context)


def _call(item: Any) -> Any:
    assert _FN is not None
    return _FN(item)


def map_ordered(
    make_fn: Callable[[Any], Callable[[T], R]],
    context: Any,
    items: Iterable[T],
    *,
    workers: int = 1,
    window: int = 1024,
    chunksize: int = 8,
) -> Iterator[R]:
    """``make_fn(context)(item)`` for every item, results in input order.

    ``make_fn`` must be a module-level callable (it crosses to spawned workers); ``context`` plain data.
    """
    if workers <= 1:
        yield from map(make_fn(context), items)
        return
    import multiprocessing as mp

    # spawn, not fork: tokenizers' thread pools and fork do not mix
    with mp.get_context("spawn").Pool(workers, initializer=_init, initargs=(make_fn, context)) as pool:
        it = iter(items)
        while chunk := list(islice(it, window)):
            yield from pool.imap(_call, chunk, chunksize=chunksize)
