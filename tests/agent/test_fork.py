"""Fork safety: DataLoader workers forked from an attached process record nothing, keep no
agent hook, and can attach themselves; the parent goes on recording."""

from __future__ import annotations

import gc
import os
from typing import Any

import pytest

from tests.helpers.sinks import ListSink

torch = pytest.importorskip("torch")


class Probe(torch.utils.data.Dataset):  # type: ignore[misc]
    """Each item, fetched in a forked worker, reports what the agent left in that process."""

    def __init__(self, inherited: Any, gc_hooks_before: int, all_reduce: Any) -> None:
        self.inherited = inherited
        self.gc_hooks_before = gc_hooks_before
        self.all_reduce = all_reduce  # torch's own, before attach

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        import torch.distributed as dist

        import argus

        for _ in range(200):  # the hook kept recording GC pauses in the child: 200 spans each
            gc.collect(0)
        a = self.inherited
        return torch.tensor(
            [
                os.getpid(),
                argus.api.attached() is None,
                len(a.recorder.spans),
                len(a._finished),
                len(gc.callbacks) == self.gc_hooks_before,
                dist.all_reduce is self.all_reduce,
                a.forked,
            ]
        )


def test_dataloader_workers_forked_from_an_attached_process_record_nothing(tmp_path):
    import argus

    gc_hooks_before = len(gc.callbacks)
    all_reduce = torch.distributed.all_reduce
    sink = ListSink()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    agent = argus.attach(model, opt, sink=sink, job="fork-test", heartbeat_s=0.2, home=str(tmp_path))
    try:
        assert torch.distributed.all_reduce is not all_reduce  # hooked in the parent
        loader = torch.utils.data.DataLoader(
            Probe(agent, gc_hooks_before, all_reduce),
            batch_size=2,
            num_workers=2,
            multiprocessing_context="fork",
        )
        rows = []
        for batch in loader:
            rows.extend(batch.tolist())
            loss = model(torch.randn(2, 4)).sum()
            loss.backward()
            opt.step()  # ends a step in the parent
        pids = {r[0] for r in rows}
        assert os.getpid() not in pids and len(pids) == 2  # really two forked workers
        for _pid, detached, spans, finished, gc_clean, unhooked, forked in rows:
            assert detached and gc_clean and unhooked and forked
            assert spans == 0 and finished == 0
        # a worker could attach itself: the module state it inherited was reset
        assert argus.api.attached() is agent  # the parent is untouched
    finally:
        argus.detach()
    steps = [r for _t, _k, r in sink.records if type(r).__name__ == "StepBatch"]
    assert len(steps) >= 3
    assert len(gc.callbacks) == gc_hooks_before


def test_a_forked_child_can_attach_itself(tmp_path):
    import argus

    sink = ListSink()
    argus.attach(sink=sink, job="fork-parent", home=str(tmp_path))
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                own = ListSink()
                assert argus.api.attached() is None
                child = argus.attach(sink=own, job="fork-child", home=str(tmp_path))
                with argus.step(samples=3):
                    pass
                argus.detach()
                ok = child.info.job == "fork-child" and any(
                    type(x).__name__ == "StepBatch" for _t, _k, x in own.records
                )
                code = 0 if ok else 2
            finally:
                os.write(w, bytes([code]))
                os._exit(0)
        os.close(w)
        assert os.read(r, 1) == b"\x00"
        os.waitpid(pid, 0)
    finally:
        argus.detach()
