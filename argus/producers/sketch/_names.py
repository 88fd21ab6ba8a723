"""Per-rank kernel-name interning: each name gets a small id, sent once as KernelNames."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from argus.schemas import KernelNames

__all__ = ["NameInterner"]


class NameInterner:
    """Kernel names of one rank → dense ids, remembering which names were not sent yet.

    Ids are handed out in order of first sight (0, 1, 2, ...); :meth:`pending` returns the
    ``KernelNames`` record of the names interned since the last call (None if there are
    none), so the dictionary goes out once and again only for new names.
    """

    def __init__(self, job: str, run: int, rank: int) -> None:
        self.job, self.run, self.rank = job, run, rank
        self._ids: dict[str, int] = {}
        self._names: list[str] = []
        self._sent = 0

    def __len__(self) -> int:
        return len(self._names)

    def intern(self, name: str) -> int:
        """The id of ``name``, a new one if it was never seen."""
        i = self._ids.get(name)
        if i is None:
            i = self._ids[name] = len(self._names)
            self._names.append(name)
        return i

    def intern_many(self, names: Iterable[str]) -> np.ndarray:
        """Ids of many names (int32)."""
        get = self._ids.get
        out = []
        for n in names:
            i = get(n)
            out.append(self.intern(n) if i is None else i)
        return np.array(out, dtype=np.int32)

    def name(self, kernel_id: int) -> str:
        """The name behind an id."""
        return self._names[kernel_id]

    def pending(self) -> KernelNames | None:
        """The names not sent yet as one record, marking them sent; None if nothing is new."""
        if self._sent == len(self._names):
            return None
        ids = tuple(range(self._sent, len(self._names)))
        names = tuple(self._names[self._sent :])
        self._sent = len(self._names)
        return KernelNames(self.job, self.run, self.rank, ids, names)

    def resend_all(self) -> None:
        """Send the whole dictionary again with the next :meth:`pending` (e.g. after a restart)."""
        self._sent = 0
