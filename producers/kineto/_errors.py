"""The importer's error: a trace that cannot be imported, with the file named."""

from __future__ import annotations

__all__ = ["TraceError"]


class TraceError(Exception):
    """A trace file that cannot be imported; ``str()`` names the file and the problem."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem
