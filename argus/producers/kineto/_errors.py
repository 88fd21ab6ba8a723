"""The importer's error: a trace that cannot be imported, with the file named (a
:class:`~producers._errors.ProducerError`)."""

from __future__ import annotations

from .._errors import ProducerError

__all__ = ["TraceError"]


class TraceError(ProducerError):
    """A trace file that cannot be imported; ``str()`` names the file and the problem."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem

    def __reduce__(self) -> tuple[type[TraceError], tuple[str, str]]:
        # pickled from an import worker process to the parent (``argus import-trace -j``)
        return TraceError, (self.path, self.problem)
