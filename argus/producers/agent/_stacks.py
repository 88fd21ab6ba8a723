"""Python call stacks of the training thread, folded (``frame;frame;frame``, root first).

Frames are ``path:function`` with the path relative to site-packages or the working
directory (``torch/nn/modules/module.py:_call_impl``), as the detectors and the simulator
write them. A sample is cheap: :meth:`StackFolder.sample_key` walks the frame chain once
and returns the tuple of the frames' code-object ids (leaf first); windows count those
keys, and the strings are built only when a window is published
(:meth:`StackFolder.folded`), with one label cached per code object.
"""

from __future__ import annotations

import gc
import os
import sys
from collections import Counter
from collections.abc import Hashable
from types import CodeType, FrameType

__all__ = ["StackFolder", "StackKey", "StackWindow", "current_frames"]

_GC_SAFE_FRAMES = sys.version_info >= (3, 12)

StackKey = tuple[int, ...]
"""A sampled stack: ids of its frames' code objects, leaf first (see StackFolder)."""


def _short(path: str, cwd: str) -> str:
    i = path.rfind("site-packages/")
    if i >= 0:
        return path[i + len("site-packages/") :]
    if path.startswith(cwd):
        return path[len(cwd) :].lstrip("/")
    return os.path.basename(path)


class StackFolder:
    """Sample stacks as code-object keys and fold keys into strings (labels cached)."""

    def __init__(self, max_depth: int = 128) -> None:
        self.max_depth = max_depth
        self._labels: dict[int, str] = {}
        # every code object a key names stays alive here, so its id is never reused
        self._codes: dict[int, CodeType] = {}
        self._cwd = os.getcwd().rstrip("/") + "/"

    def label(self, code: CodeType) -> str:
        """``path:function`` of a code object."""
        s = self._labels.get(id(code))
        if s is None:
            self._codes[id(code)] = code
            s = self._labels[id(code)] = f"{_short(code.co_filename, self._cwd)}:{code.co_name}"
        return s

    def key(self, frame: FrameType | None) -> StackKey:
        """The stack ending at ``frame`` as code-object ids, leaf first (one walk, no strings)."""
        ids: list[int] = []
        codes = self._codes
        depth = self.max_depth
        while frame is not None and len(ids) < depth:
            code = frame.f_code
            i = id(code)
            if i not in codes:
                codes[i] = code
            ids.append(i)
            frame = frame.f_back
        return tuple(ids)

    def folded(self, key: StackKey) -> str:
        """The folded string of a key (root first)."""
        labels, codes = self._labels, self._codes
        parts = [labels.get(i) or self.label(codes[i]) for i in reversed(key)]
        return ";".join(parts)

    def fold(self, frame: FrameType | None) -> str:
        """The folded stack ending at ``frame`` (root first)."""
        return self.folded(self.key(frame))

    def sample_key(self, thread_id: int) -> StackKey | None:
        """The stack of one thread now as a key (None if the thread is gone)."""
        frame = current_frames().get(thread_id)
        return None if frame is None else self.key(frame)

    def sample(self, thread_id: int) -> str | None:
        """The folded stack of one thread now (None if the thread is gone)."""
        key = self.sample_key(thread_id)
        return None if key is None else self.folded(key)


def current_frames() -> dict[int, FrameType]:
    """``sys._current_frames()``, safe to call from a sampling thread on every Python.

    Before 3.12 it holds the runtime's lock on the thread list while it makes frame objects;
    a garbage collection that starts there and frees a ``threading.local`` (or lets another
    thread end) takes that lock again, and the whole process deadlocks (CPython gh-106883,
    fixed in 3.12 only). The collector is held off for the call: only C code runs between
    ``gc.disable()`` and ``gc.enable()``, so no other Python thread runs in between to see
    it off (an audit hook on ``sys._current_frames`` would), and a collector that was off
    stays off."""
    if _GC_SAFE_FRAMES or not gc.isenabled():
        return sys._current_frames()
    gc.disable()
    try:
        return sys._current_frames()
    finally:
        gc.enable()


class StackWindow:
    """Counts of sampled stacks (keys or folded strings) over one window."""

    def __init__(self, step: int, start_ns: int) -> None:
        self.step = step
        self.start_ns = start_ns
        self.counts: Counter[Hashable] = Counter()

    def add(self, stack: Hashable) -> None:
        """Count one sample."""
        self.counts[stack] += 1

    def __len__(self) -> int:
        return sum(self.counts.values())

    def folded(self, folder: StackFolder | None = None) -> list[str]:
        """py-spy's folded text, one ``stack count`` line per stack (keys folded by ``folder``)."""
        return [
            f"{folder.folded(s) if folder is not None and isinstance(s, tuple) else s} {n}"
            for s, n in self.counts.most_common()
        ]
