"""What a collective is to the agent: its step-record column and reported size (the public
``torch.distributed`` functions and the functional collectives), its process group's
counters for the heartbeat, and the open spans of functional collectives until their results
are waited for. The hooks that time them are in :mod:`._hooks`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ._spans import SpanRecorder

__all__ = [
    "ASYNC_ALWAYS",
    "COLLECTIVE_KINDS",
    "FUNCOL_KINDS",
    "MAX_WAITING",
    "GroupState",
    "PendingResults",
    "tensor_bytes",
]

COLLECTIVE_KINDS: dict[str, tuple[str, int]] = {
    # public function: (step-record column, index of the argument whose size is reported)
    "all_reduce": ("all_reduce_ms", 0),
    "reduce": ("all_reduce_ms", 0),
    "barrier": ("all_reduce_ms", -1),
    "all_gather": ("all_gather_ms", 1),
    "all_gather_into_tensor": ("all_gather_ms", 1),
    "gather": ("all_gather_ms", 0),
    "reduce_scatter": ("reduce_scatter_ms", 0),
    "reduce_scatter_tensor": ("reduce_scatter_ms", 0),
    "scatter": ("reduce_scatter_ms", 0),
    "all_to_all": ("all_to_all_ms", 1),
    "all_to_all_single": ("all_to_all_ms", 1),
    "broadcast": ("broadcast_ms", 0),
    "send": ("p2p_ms", 0),
    "recv": ("p2p_ms", 0),
    "isend": ("p2p_ms", 0),
    "irecv": ("p2p_ms", 0),
    "batch_isend_irecv": ("p2p_ms", -1),
}
ASYNC_ALWAYS = frozenset({"isend", "irecv", "batch_isend_irecv"})
FUNCOL_KINDS: dict[str, str] = {
    # torch.distributed._functional_collectives function: step-record column
    "all_reduce": "all_reduce_ms",
    "all_reduce_coalesced": "all_reduce_ms",
    "all_gather_tensor": "all_gather_ms",
    "all_gather_tensor_autograd": "all_gather_ms",
    "all_gather_into_tensor_coalesced": "all_gather_ms",
    "reduce_scatter_tensor": "reduce_scatter_ms",
    "reduce_scatter_tensor_autograd": "reduce_scatter_ms",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_ms",
    "all_to_all_single": "all_to_all_ms",
    "all_to_all_single_autograd": "all_to_all_ms",
    "broadcast": "broadcast_ms",
}
MAX_WAITING = 4096


def tensor_bytes(obj: Any) -> int:
    """Bytes of a tensor or a list of tensors (0 for anything else)."""
    if isinstance(obj, list | tuple):
        return sum(tensor_bytes(o) for o in obj)
    try:
        return int(obj.numel()) * int(obj.element_size())
    except AttributeError:
        return 0


class GroupState:
    """Per process group: collectives entered and finished, the last kind and size."""

    __slots__ = ("entered", "finished", "kind", "nbytes")

    def __init__(self) -> None:
        self.entered = 0
        self.finished = 0
        self.kind = ""
        self.nbytes = 0


class PendingResults:
    """The open spans of functional collectives, by the storage of their results
    (``AsyncCollectiveTensor``): a span closes when ``wait_tensor`` returns for one of them."""

    def __init__(self, rec: SpanRecorder, act: Any) -> None:
        self.rec = rec
        self.act = act
        self.open: dict[int, list[Any]] = {}  # storage pointer -> [token, group, still open]

    def close(self, tensor: Any) -> None:
        """Close the span of the collective whose result ``tensor`` is (if still open)."""
        try:
            entry = self.open.pop(tensor.untyped_storage().data_ptr(), None)
        except Exception:
            return
        if entry is not None and entry[2]:
            entry[2] = False
            self.rec.end_by(entry[0])
            entry[1].finished += 1

    def wait_tensor(self, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``wait_tensor`` closing the span of what it waited for."""
        pending, close = self.open, self.close

        @functools.wraps(original)
        def wait_tensor(tensor: Any) -> Any:
            out = original(tensor)
            if pending:
                close(tensor)
            return out

        return wait_tensor

    def watch(self, out: Any, token: Any, g: GroupState) -> None:
        """Keep the span ``token`` of a collective (group ``g``) open until one of its results
        ``out`` is waited for; close it now if none is waitable (waited for already: tracing,
        an all-gather on a dim > 0)."""
        entry = [token, g, True]
        waitable = False
        for t in out if isinstance(out, list | tuple) else (out,):
            if isinstance(t, self.act):
                if len(self.open) >= MAX_WAITING:  # results nobody waited for
                    self.open.pop(next(iter(self.open)))
                self.open[t.elem.untyped_storage().data_ptr()] = entry
                waitable = True
        if not waitable:
            entry[2] = False
            self.rec.end_by(token)
            g.finished += 1
