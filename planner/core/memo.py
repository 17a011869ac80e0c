"""A least-recently-used memo keyed by the identity of immutable objects (graphs, config spaces).

Frozen graphs and their stage models are asked the same questions many times over a search (every
family of every stage, every launcher), but they are not hashable cheaply by content and an
``OpGraph`` cannot be weakly referenced. The memo keys an entry by the ``id()`` of its key objects
and holds the objects themselves, so an id cannot be recycled while its entry lives, and checks them
by identity on every hit. Recently used entries stay: a pipeline search alternates between the
graphs of a dozen micro-batch sizes, which a first-in-first-out memo of a few entries would evict
before each one is asked again.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Generic, TypeVar

V = TypeVar("V")

__all__ = ["IdentityMemo"]


class IdentityMemo(Generic[V]):
    """``memo.get(key_objects, build)``: ``build()`` once per tuple of key objects (by identity),
    for the ``size`` most recently used tuples.

    Examples
    --------
    >>> memo = IdentityMemo(size=2)
    >>> a, b = object(), object()
    >>> calls = []
    >>> memo.get((a,), lambda: calls.append("a") or 1), memo.get((a,), lambda: calls.append("a") or 2)
    (1, 1)
    >>> memo.get((b,), lambda: 3), calls
    (3, ['a'])
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[tuple[int, ...], tuple[tuple, V]] = OrderedDict()

    def get(self, key_objects: tuple, build: Callable[[], V]) -> V:
        """The value kept for ``key_objects`` (compared by identity; a ``str`` tag may lead them),
        built and kept now when none is."""
        key = tuple(id(o) for o in key_objects)
        hit = self._entries.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], key_objects)):
            self._entries.move_to_end(key)
            return hit[1]
        value = build()
        self._entries[key] = (key_objects, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return value
