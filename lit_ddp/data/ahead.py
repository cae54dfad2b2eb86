"""Work started ahead of its consumer, handed out in order: ``shard`` reads files ahead of the writer
(convert.py), and ``gpu_decode`` decodes a batch ahead of training (device_decode.py)."""

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")
H = TypeVar("H")


def started_ahead(
    items: Iterable[T],
    start: Callable[[T], H],
    ahead: int,
    cancel: Callable[[H], object] = Future.cancel,
) -> Iterator[H]:
    """``start(item)`` for each item, in order, at most ``ahead`` started before the consumer takes the first
    of them: what ``start`` returned (a future, or something holding one), in order. When the consumer stops
    early, ``cancel`` is called on each one it never took: what has not begun never runs."""
    pending: deque[H] = deque()
    try:
        for item in items:
            pending.append(start(item))
            if len(pending) >= ahead:
                yield pending.popleft()
        while pending:
            yield pending.popleft()
    finally:
        for handle in pending:
            cancel(handle)
