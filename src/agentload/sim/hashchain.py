"""A conversation's block hashes as a list that also keeps them as an int64 array, each converted once.

The prefix cache works on numpy arrays of hashes (``sim.kvcache``), while the hashes arrive as Python ints, one
block at a time, and a request's list is built once per turn. An agent's conversation re-sends all of it every
turn, and past the KV knee most of it is computed and cached again, so converting ``hashes[start:stop]`` to an
array on every cache call converted each hash once per turn (8 % of the 256-agent benchmark). A ``HashChain``
converts each hash once for the life of the conversation: its array grows as the list does.

The array stays valid because a chain of block hashes only grows (the driver and the engine only append to
it); every other list mutation still works but drops the array, which is then rebuilt from the list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, SupportsIndex

import numpy as np
import numpy.typing as npt

from agentload.sim.poolkernel import address

Hashes = npt.NDArray[np.int64]


class HashChain(list[int]):
    """A list of block hashes with an int64 mirror of its first ``_mirrored`` entries."""

    __slots__ = ("_array", "_mirrored", "_p")

    def __init__(self, hashes: Iterable[int] = ()) -> None:
        super().__init__(hashes)
        self._forget()

    def _forget(self) -> None:
        # A new buffer, never the old one rewritten: views handed out earlier keep the values they had.
        self._array: Hashes = np.empty(0, dtype=np.int64)
        self._mirrored = 0
        self._p = 0  # the mirror's address, for the pool kernel

    def _room(self, stop: int) -> None:
        if stop > len(self._array):
            grown = np.empty(max(2 * len(self._array), stop, 256), dtype=np.int64)
            grown[: self._mirrored] = self._array[: self._mirrored]
            self._array = grown
            self._p = address(grown)

    def _mirror(self, stop: int) -> None:
        done = self._mirrored
        if stop > done:
            self._room(stop)
            self._array[done:stop] = self[done:stop]
            self._mirrored = stop

    def array(self, stop: int) -> Hashes:
        """The first ``stop`` hashes as an int64 array (a read-only view; valid for as long as the caller needs,
        since entries already mirrored never change)."""
        self._mirror(stop)
        view = self._array[:stop]
        view.flags.writeable = False
        return view

    def address(self, stop: int) -> int:
        """The address of the mirror's first hash, mirrored up to ``stop`` (for the pool kernel: ``array`` without
        the view, which costs as much as the kernel's call). Valid until the chain next grows."""
        self._mirror(stop)
        return self._p

    def extend_into_mirror(self, count: int, fill: Callable[[int], None]) -> None:
        """Append ``count`` hashes that ``fill(address)`` writes as int64s at ``address``: straight into the mirror,
        so they are converted to Python ints once and never back."""
        n = len(self)
        self._mirror(n)
        self._room(n + count)
        fill(self._p + 8 * n)
        super().extend(self._array[n : n + count].tolist())
        self._mirrored = n + count

    # Appending (append, extend, +=) keeps the mirror; anything that changes existing entries drops it.
    def __setitem__(self, index: Any, value: Any) -> None:
        super().__setitem__(index, value)
        self._forget()

    def __delitem__(self, index: Any) -> None:
        super().__delitem__(index)
        self._forget()

    def insert(self, index: SupportsIndex, value: int) -> None:
        super().insert(index, value)
        self._forget()

    def pop(self, index: SupportsIndex = -1) -> int:
        out = super().pop(index)
        self._forget()
        return out

    def remove(self, value: int) -> None:
        super().remove(value)
        self._forget()

    def clear(self) -> None:
        super().clear()
        self._forget()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        super().sort(*args, **kwargs)
        self._forget()

    def reverse(self) -> None:
        super().reverse()
        self._forget()

    def __imul__(self, count: SupportsIndex) -> HashChain:
        super().__imul__(count)
        self._forget()
        return self


def hash_array(hashes: Sequence[int], start: int, stop: int) -> Hashes:
    """``hashes[start:stop]`` as an int64 array: a view of a ``HashChain``'s mirror, else a conversion."""
    if isinstance(hashes, HashChain):
        return hashes.array(stop)[start:stop]
    return np.array(hashes[start:stop], dtype=np.int64)
