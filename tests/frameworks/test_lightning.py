"""A real 2-process Lightning ``Trainer(strategy="ddp", accelerator="cpu")`` with the callback
as the README writes it: step records with phases, DDP's all-reduce time, samples; rank 1
slowed by 60 ms is diagnosed as the compute straggler."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.frameworks.common import REPO, batches, check_straggler, load

pytest.importorskip("lightning")
pytestmark = pytest.mark.slow


def test_lightning_ddp_on_cpu_records_steps_and_names_the_slowed_rank(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):  # Lightning launches the ranks
        env.pop(name, None)
    job = [sys.executable, str(REPO / "tests" / "frameworks" / "lightning_job.py"), str(tmp_path), "1"]
    out = subprocess.run(job, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    results = load(tmp_path, 2)
    assert [r["info"]["rank"] for r in results] == [0, 1]
    steps = batches(results)
    assert len(steps) == 24 and all(len(b) == 2 for b in steps)
    for b in steps[2:]:
        for col in ("forward_ms", "backward_ms", "optimizer_ms", "all_reduce_ms"):
            assert (b[col] > 0).all(), (b.step, col)
        assert (b["samples"] == 8).all()
    check_straggler(steps, slow=1)
