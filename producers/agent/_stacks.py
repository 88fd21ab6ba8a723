"""Python call stacks of the training thread, folded (``frame;frame;frame``, root first).

Frames are ``path:function`` with the path relative to site-packages or the working
directory (``torch/nn/modules/module.py:_call_impl``), as the detectors and the simulator
write them. :class:`StackFolder` caches one label per code object, so a sample costs one
walk up the frame chain.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from types import CodeType, FrameType

__all__ = ["StackFolder", "StackWindow"]


def _short(path: str, cwd: str) -> str:
    i = path.rfind("site-packages/")
    if i >= 0:
        return path[i + len("site-packages/") :]
    if path.startswith(cwd):
        return path[len(cwd) :].lstrip("/")
    return os.path.basename(path)


class StackFolder:
    """Fold frames into strings, with a per-code-object label cache."""

    def __init__(self, max_depth: int = 128) -> None:
        self.max_depth = max_depth
        self._labels: dict[CodeType, str] = {}
        self._cwd = os.getcwd().rstrip("/") + "/"

    def label(self, code: CodeType) -> str:
        """``path:function`` of a code object."""
        s = self._labels.get(code)
        if s is None:
            s = self._labels[code] = f"{_short(code.co_filename, self._cwd)}:{code.co_name}"
        return s

    def fold(self, frame: FrameType | None) -> str:
        """The folded stack ending at ``frame`` (root first)."""
        parts: list[str] = []
        labels, label = self._labels, self.label
        while frame is not None and len(parts) < self.max_depth:
            code = frame.f_code
            parts.append(labels.get(code) or label(code))
            frame = frame.f_back
        parts.reverse()
        return ";".join(parts)

    def sample(self, thread_id: int) -> str | None:
        """The folded stack of one thread now (None if the thread is gone)."""
        frame = sys._current_frames().get(thread_id)
        return None if frame is None else self.fold(frame)


class StackWindow:
    """Counts of folded stacks over one window (one step, or a time window)."""

    def __init__(self, step: int, start_ns: int) -> None:
        self.step = step
        self.start_ns = start_ns
        self.counts: Counter[str] = Counter()

    def add(self, stack: str) -> None:
        """Count one sample."""
        self.counts[stack] += 1

    def __len__(self) -> int:
        return sum(self.counts.values())

    def folded(self) -> list[str]:
        """py-spy's folded text, one ``stack count`` line per stack."""
        return [f"{s} {n}" for s, n in self.counts.most_common()]
