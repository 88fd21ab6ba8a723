"""A Hugging Face ``Trainer`` on a tiny in-process GPT-2 under torchrun, 2 gloo processes, with
the callback as the README writes it: step records with phases, DDP's all-reduce time,
samples and tokens; rank 1 slowed by 60 ms is diagnosed as the compute straggler."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.frameworks.common import REPO, batches, check_straggler, load
from tests.helpers.net import free_port

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytestmark = pytest.mark.slow


def test_hf_trainer_under_torchrun_records_steps_tokens_and_names_the_slowed_rank(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += [
        "--master-port",
        str(free_port()),
        str(REPO / "tests" / "frameworks" / "hf_job.py"),
        str(tmp_path),
        "1",
    ]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    results = load(tmp_path, 2)
    steps = batches(results)
    assert len(steps) == 24 and all(len(b) == 2 for b in steps)
    for b in steps[2:]:
        for col in ("forward_ms", "backward_ms", "optimizer_ms", "all_reduce_ms"):
            assert (b[col] > 0).all(), (b.step, col)
        assert (b["samples"] == 4).all()
        assert (b["tokens"] == 4 * 32).all()  # this rank's batch: 4 sequences of 32 tokens
    check_straggler(steps, slow=1)
