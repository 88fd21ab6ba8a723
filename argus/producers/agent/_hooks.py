"""The framework layer: hooks on PyTorch that time a step's phases.

* forward: pre/post forward hooks on the model (``always_call`` so an exception closes it);
* backward: ``torch.autograd.backward`` (what ``Tensor.backward`` calls) wrapped;
* optimizer: ``register_step_pre_hook`` / ``register_step_post_hook``;
* data-loader wait: ``_BaseDataLoaderIter.__next__`` wrapped;
* collectives: the public ``torch.distributed`` functions wrapped (kind, bytes, group;
  a span from the call to the work's completion: sync calls when they return, ``async_op``
  work when its future completes, on whatever thread that happens, or, on the CPU clock,
  when ``Work.wait()`` returns if that is earlier), with a per-group
  sequence number entered and finished for the heartbeat. FSDP2 (``fully_shard``) and
  FSDP1 issue their all-gathers and reduce-scatters through these functions;
* DDP: the C++ reducer never calls them; its all-reduce is timed as the wait it leaves
  the rank with, from the end of backward's computation (a final callback queued ahead of
  DDP's finalizer) to ``backward`` returning (:meth:`Instrumentation.install_ddp`); a DDP
  with a user's Python hook is left alone (its collectives are the wrapped functions);
* host-to-device copies: ``Tensor.to`` / ``Tensor.cuda`` wrapped, only when CUDA is present;
* GC pauses: ``gc.callbacks``; torch.compile: dynamo's compile start/end callbacks.

Every patch is undone by :meth:`Instrumentation.uninstall`. A hook never raises into the
training loop: the wrapped call runs even if the timing fails.
"""

from __future__ import annotations

import functools
import gc
import inspect
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

from ._collectives import (
    ASYNC_ALWAYS,
    COLLECTIVE_KINDS,
    FUNCOL_KINDS,
    MAX_WAITING,
    GroupState,
    PendingResults,
    tensor_bytes,
)
from ._spans import COLUMN_INDEX, CpuClock, SpanRecorder

__all__ = ["COLLECTIVE_KINDS", "FUNCOL_KINDS", "GroupState", "Instrumentation", "tensor_bytes"]

log = logging.getLogger("argus.agent")


class Instrumentation:
    """Installs and removes the framework hooks; spans go to ``recorder``."""

    def __init__(
        self, recorder: SpanRecorder, *, on_optimizer_step: Callable[[], None] | None = None
    ) -> None:
        self.rec = recorder
        self.on_optimizer_step = on_optimizer_step
        self.groups: dict[str, GroupState] = {}
        self._group_names: dict[int, str] = {}
        self._undo: list[Callable[[], None]] = []
        self._local = threading.local()
        self.compile_hooked = False
        self.notes: dict[str, str] = {}
        self._waiting: dict[int, Any] | None = None

    # -- install / uninstall -----------------------------------------------------------
    def _patch(self, owner: Any, name: str, wrapper: Any) -> None:
        original = getattr(owner, name)
        setattr(owner, name, wrapper)
        self._undo.append(lambda: setattr(owner, name, original))

    def uninstall(self) -> None:
        """Undo every hook and patch (last installed first)."""
        while self._undo:
            try:
                self._undo.pop()()
            except Exception:
                log.debug("undoing a hook failed", exc_info=True)

    def install_model(self, model: Any) -> None:
        """Forward pre/post hooks on the root module."""
        col = COLUMN_INDEX["forward_ms"]
        slot: list[Any] = []

        def pre(_m: Any, _args: Any) -> None:
            slot.append(self.rec.begin(col))

        def post(_m: Any, _args: Any, _out: Any) -> None:
            if slot:
                self.rec.end(slot.pop())

        h1 = model.register_forward_pre_hook(pre)
        h2 = model.register_forward_hook(post, always_call=True)
        self._undo.extend([h1.remove, h2.remove])

    def install_optimizer(self, optimizer: Any) -> None:
        """Step pre/post hooks; the post hook also ends the step in automatic mode."""
        col = COLUMN_INDEX["optimizer_ms"]
        slot: list[Any] = []

        def pre(_opt: Any, _args: Any, _kwargs: Any) -> None:
            slot.append(self.rec.begin(col))

        def post(_opt: Any, _args: Any, _kwargs: Any) -> None:
            if slot:
                self.rec.end(slot.pop())
            if self.on_optimizer_step is not None:
                self.on_optimizer_step()

        h1 = optimizer.register_step_pre_hook(pre)
        h2 = optimizer.register_step_post_hook(post)
        self._undo.extend([h1.remove, h2.remove])

    def _timed(self, column: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        col = COLUMN_INDEX[column]
        rec = self.rec

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            token = rec.begin(col)
            try:
                return fn(*args, **kwargs)
            finally:
                rec.end(token)

        return wrapper

    def install_backward(self) -> None:
        """Time ``torch.autograd.backward``."""
        import torch.autograd

        self._patch(torch.autograd, "backward", self._timed("backward_ms", torch.autograd.backward))

    def install_dataloader(self) -> None:
        """Time the wait for the next batch of every DataLoader iterator."""
        from torch.utils.data import dataloader

        cls = dataloader._BaseDataLoaderIter
        self._patch(cls, "__next__", self._timed("dataloader_ms", cls.__next__))

    def install_gc(self) -> None:
        """Time garbage-collector pauses (any generation, any thread)."""
        col = COLUMN_INDEX["gc_ms"]
        slot: list[Any] = []
        rec = self.rec

        def callback(phase: str, _info: dict[str, Any]) -> None:
            if phase == "start":
                slot.append(rec.begin(col))
            elif slot:
                rec.end(slot.pop())

        gc.callbacks.append(callback)
        self._undo.append(lambda: gc.callbacks.remove(callback))

    def install_compile(self) -> bool:
        """Time torch.compile (dynamo) compilations, if dynamo is already imported."""
        if self.compile_hooked or "torch._dynamo" not in sys.modules:
            return False
        try:
            from torch._dynamo.callback import callback_handler
        except ImportError:
            return False
        col = COLUMN_INDEX["compile_ms"]
        slot: list[Any] = []
        rec = self.rec

        def start(_args: Any) -> None:
            slot.append(rec.begin(col))

        def end(_args: Any) -> None:
            if slot:
                rec.end(slot.pop())

        callback_handler.register_start_callback(start)
        callback_handler.register_end_callback(end)
        self._undo.append(lambda: callback_handler.remove_start_callback(start))
        self._undo.append(lambda: callback_handler.remove_end_callback(end))
        self.compile_hooked = True
        return True

    def install_h2d(self) -> bool:
        """Time host-to-device copies (``Tensor.to`` / ``Tensor.cuda``) when CUDA is present."""
        import torch

        if not torch.cuda.is_available():
            return False
        col = COLUMN_INDEX["h2d_ms"]
        rec = self.rec

        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(fn)
            def wrapper(t: Any, *args: Any, **kwargs: Any) -> Any:
                if t.device.type != "cpu":
                    return fn(t, *args, **kwargs)
                token = rec.begin(col)
                out = fn(t, *args, **kwargs)
                if out.device.type == "cuda":
                    rec.end(token)
                else:  # not a host-to-device copy: make the span empty
                    token[0][token[1]][2] = token[0][token[1]][1]
                return out

            return wrapper

        self._patch(torch.Tensor, "to", wrap(torch.Tensor.to))
        self._patch(torch.Tensor, "cuda", wrap(torch.Tensor.cuda))
        return True

    # -- collectives -------------------------------------------------------------------
    def _group_name(self, group: Any) -> str:
        if group is None or group is self._world():
            return "world"
        key = id(group)
        name = self._group_names.get(key)
        if name is None:
            try:
                from torch.distributed.distributed_c10d import _get_process_group_name

                name = str(_get_process_group_name(group))
            except Exception:
                name = str(getattr(group, "group_name", key))
            self._group_names[key] = name
        return name

    @staticmethod
    def _world() -> Any:
        try:
            from torch.distributed.distributed_c10d import GroupMember

            return GroupMember.WORLD
        except Exception:
            return None

    def _wrap_collective(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        column, size_arg = COLLECTIVE_KINDS[name]
        col = COLUMN_INDEX[column]
        rec, local, groups = self.rec, self._local, self.groups

        always_async = name in ASYNC_ALWAYS

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if getattr(local, "depth", 0):  # nested inside another wrapped collective
                return fn(*args, **kwargs)
            try:
                is_async = always_async or bool(kwargs.get("async_op"))
                gname = self._group_name(kwargs.get("group"))
                g = groups.get(gname)
                if g is None:
                    g = groups[gname] = GroupState()
                g.entered += 1
                g.kind = name
                if 0 <= size_arg < len(args):
                    g.nbytes = tensor_bytes(args[size_arg])
                token = rec.begin(col, nest=False)
            except Exception:
                return fn(*args, **kwargs)
            local.depth = 1
            try:
                work = fn(*args, **kwargs)
            except BaseException:
                rec.end(token)
                g.finished += 1
                raise
            finally:
                local.depth = 0
            if work is None or not is_async:
                rec.end(token)
                g.finished += 1
                return work
            self._close_on_completion(work, token, g)
            return work

        return wrapper

    def _close_on_completion(self, work: Any, token: Any, g: GroupState) -> None:
        rec = self.rec

        def done(_fut: Any) -> None:
            rec.end_by(token)
            g.finished += 1

        try:
            if isinstance(work, list):
                import torch.futures

                torch.futures.collect_all([w.get_future() for w in work]).add_done_callback(done)
            else:
                if self._waiting is not None:
                    if len(self._waiting) >= MAX_WAITING:  # work nobody waited for
                        self._waiting.pop(next(iter(self._waiting)))
                    self._waiting[id(work)] = token
                work.get_future().add_done_callback(done)
        except Exception:  # a backend without futures: count it as finished now
            done(None)

    def _install_work_wait(self) -> None:
        """Close an async collective's span when ``Work.wait()`` returns, if that is earlier
        than its future's callback (which needs the GIL, held by a busy training thread)."""
        import torch.distributed as dist

        work_cls = dist.Work
        original = work_cls.wait
        waiting: dict[int, Any] = {}
        rec = self.rec

        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(work, *args, **kwargs)
            if waiting:
                token = waiting.pop(id(work), None)
                if token is not None:
                    rec.end_by(token)
            return out

        self._patch(work_cls, "wait", wait)
        self._waiting = waiting

    def install_collectives(self) -> list[str]:
        """Wrap the public collective functions of ``torch.distributed``; return their names."""
        import torch.distributed as dist

        if not dist.is_available():
            return []
        from torch.distributed import distributed_c10d as c10d

        wrapped = []
        for name in COLLECTIVE_KINDS:
            fn = getattr(c10d, name, None)
            if fn is None:
                continue
            w = self._wrap_collective(name, fn)
            self._patch(c10d, name, w)
            if getattr(dist, name, None) is fn:
                self._patch(dist, name, w)
            wrapped.append(name)
        if isinstance(self.rec.clock, CpuClock):  # on a GPU, wait() returns before completion
            self._install_work_wait()
        self.install_ddp()
        wrapped += self.install_funcol()
        return wrapped

    def install_funcol(self) -> list[str]:
        """Time functional collectives (``torch.distributed._functional_collectives``) in eager mode.

        Each public function is wrapped: its span opens at the call and closes when
        ``wait_tensor`` (what ``AsyncCollectiveTensor`` calls on first use or ``.wait()``)
        returns for one of its outputs, found by the output's storage. A result never
        waited for in Python (compiled code, tracing) is not timed; under ``torch.compile``
        the wrappers step aside at once. Returns the names wrapped.
        """
        try:
            import torch
            import torch.distributed._functional_collectives as funcol
        except Exception:
            return []
        original_wait = getattr(funcol, "wait_tensor", None)
        act = getattr(funcol, "AsyncCollectiveTensor", None)
        resolve = getattr(funcol, "_resolve_group_name", None)
        if original_wait is None or act is None or resolve is None:
            return []
        pending = PendingResults(self.rec, act)
        compiling = getattr(torch.compiler, "is_compiling", lambda: False)
        wrapped = []
        self._patch(funcol, "wait_tensor", pending.wait_tensor(original_wait))
        for name in FUNCOL_KINDS:
            fn = getattr(funcol, name, None)
            if fn is not None:
                self._patch(funcol, name, self._wrap_funcol(name, fn, resolve, pending, compiling))
                wrapped.append(f"funcol.{name}")
        return wrapped

    def _wrap_funcol(
        self,
        name: str,
        fn: Callable[..., Any],
        resolve: Callable[[Any, str], Any],
        pending: PendingResults,
        compiling: Callable[[], bool],
    ) -> Callable[..., Any]:
        """``fn`` timed: the span opens at the call and is left to ``pending`` to close."""
        col = COLUMN_INDEX[FUNCOL_KINDS[name]]
        rec = self.rec
        group_state = self._funcol_groups(fn, resolve)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if compiling():
                return fn(*args, **kwargs)
            try:
                g = group_state(args, kwargs)
                g.entered += 1
                g.kind = name
                g.nbytes = tensor_bytes(args[0]) if args else 0
                token = rec.begin(col, nest=False)
            except Exception:
                return fn(*args, **kwargs)
            try:
                out = fn(*args, **kwargs)
            except BaseException:
                rec.end(token)
                g.finished += 1
                raise
            pending.watch(out, token, g)
            return out

        return wrapper

    def _funcol_groups(
        self, fn: Callable[..., Any], resolve: Callable[[Any, str], Any]
    ) -> Callable[[tuple[Any, ...], dict[str, Any]], GroupState]:
        """The group state of a call of functional collective ``fn``: its group argument (a
        ProcessGroup, ranks, a mesh) and the tag after it, resolved to a name once per
        group object (not for ranks: a new list each call)."""
        params = list(inspect.signature(fn).parameters)
        gi = params.index("group")  # the group, then the tag
        # (id of the group object, tag) -> (the object, kept so its id is not reused; name)
        names: dict[tuple[int, str], tuple[Any, str]] = {}

        def group_state(args: tuple[Any, ...], kwargs: dict[str, Any]) -> GroupState:
            group = args[gi] if len(args) > gi else kwargs.get("group")
            tag = str(args[gi + 1] if len(args) > gi + 1 else kwargs.get("tag", ""))
            known = names.get((id(group), tag))
            if known is not None:
                return self._group(known[1])
            gname = str(resolve(group, tag))
            if not isinstance(group, list) and len(names) < 1024:
                names[(id(group), tag)] = (group, gname)
            return self._group(gname)

        return group_state

    def install_ddp(self) -> bool:
        """Time the gradient all-reduce of every ``DistributedDataParallel`` as the wait it
        leaves the rank with, without a communication hook.

        DDP's C++ reducer starts each bucket's all-reduce as soon as its gradients are ready,
        overlapped with the rest of backward, and waits for all of them in its finalizer: an
        autograd final callback queued when the last bucket is ready, so it runs once
        backward's computation is over. After the forward of a DDP that will reduce (grad
        enabled, not under ``no_sync``, no user hook), the next ``torch.autograd.backward``
        gets a pre-hook on the root of its graph, which queues a final callback of Argus's
        own ahead of DDP's. That callback opens the ``all_reduce`` span (computation done);
        ``backward`` returning closes it (DDP's reduction done, gradients written back). The
        span is the part of the all-reduce that the rank waits for: the buckets that finish
        while backward still computes cost nothing and count nothing, a peer that is late
        shows as its wait. DDP keeps its own fused C++ path; Argus adds four Python calls per
        synchronizing backward and none per bucket. A DDP with a user's Python hook is left
        alone: its collectives are timed through the wrapped functions.
        """
        try:
            import torch
            from torch.nn.parallel import DistributedDataParallel
        except Exception:
            return False
        engine = torch.autograd.Variable._execution_engine
        original_forward: Callable[..., Any] = DistributedDataParallel.forward
        original_backward: Callable[..., Any] = torch.autograd.backward
        col = COLUMN_INDEX["all_reduce_ms"]
        rec = self.rec
        pending: list[tuple[GroupState, int]] = []  # the reducing DDP's group and bytes

        def reduces(ddp: Any) -> tuple[GroupState, int] | None:
            if not (ddp.require_backward_grad_sync and torch.is_grad_enabled()):
                return None
            if ddp._comm_hooks or getattr(ddp, "_use_python_reducer", False):
                return None
            known = ddp.__dict__.get("_argus_group")
            if known is None:
                nbytes = sum(tensor_bytes(p) for p in ddp.parameters() if p.requires_grad)
                known = ddp.__dict__["_argus_group"] = (self._group_name(ddp.process_group), nbytes)
            return self._group(known[0]), known[1]

        @functools.wraps(original_forward)
        def forward(ddp: Any, *args: Any, **kwargs: Any) -> Any:
            out = original_forward(ddp, *args, **kwargs)
            try:
                target = reduces(ddp)
                if target is not None:
                    pending[:] = [target]
            except Exception:
                log.debug("argus: reading a DDP model failed", exc_info=True)
            return out

        @functools.wraps(original_backward)
        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if not pending:
                return original_backward(tensors, *args, **kwargs)
            g, nbytes = pending.pop()
            opened: list[Any] = []

            def computed() -> None:  # a final callback, ahead of DDP's finalizer
                g.entered += 1
                g.kind = "all_reduce"
                g.nbytes = nbytes
                opened.append(rec.begin(col, nest=False))

            def first_node(_grads: Any) -> None:
                engine.queue_callback(computed)

            handle = _root_prehook(tensors, first_node)
            try:
                return original_backward(tensors, *args, **kwargs)
            finally:
                if handle is not None:
                    handle.remove()
                if opened:
                    rec.end_by(opened[0])
                    g.finished += 1

        self._patch(DistributedDataParallel, "forward", forward)
        self._patch(torch.autograd, "backward", backward)
        return True

    def _group(self, name: str) -> GroupState:
        g = self.groups.get(name)
        if g is None:
            g = self.groups[name] = GroupState()
        return g


def _root_prehook(tensors: Any, hook: Callable[[Any], None]) -> Any:
    """Register ``hook`` as a pre-hook of the first graph root among ``tensors`` (what
    ``torch.autograd.backward`` takes); its handle, or None if none has a ``grad_fn``."""
    for t in tensors if isinstance(tensors, list | tuple) else (tensors,):
        fn = getattr(t, "grad_fn", None)
        if fn is not None:
            try:
                return fn.register_prehook(hook)
            except Exception:
                return None
    return None
