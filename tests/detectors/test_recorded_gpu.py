"""The diagnosis with the kernel level on what the agents recorded on an NVIDIA H200
(``bench/gpu.py``'s straggler part, torch 2.11 / CUDA 13.0, 2026-11-27): two ranks sharing
the GPU under MPS, data parallel over gloo, steps of ~240 ms; rank 1 runs a ~250 ms
busy-wait kernel before its forward in steps 30-59. Its CPU-side phases barely change (its
kernels queue behind the spin), so the steps only say that rank 0 waits in the all-reduce;
the kernel sketches (one step in 16 traced: 32 and 48 fall in the stretch) say why.
Each line: the rank, the topic and the record's wire bytes (base64)."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path
from typing import Any

from argus.schemas import STEPS, decode
from tests.helpers.bench import load_bench

DATA = Path(__file__).resolve().parents[1] / "data" / "h200_2_ranks_rank1_spin_30_59.jsonl.gz"


def _ranks() -> list[list[tuple[str, Any]]]:
    ranks: list[list[tuple[str, Any]]] = [[], []]
    for line in gzip.decompress(DATA.read_bytes()).splitlines():
        row = json.loads(line)
        raw = base64.b64decode(row["avro"])
        ranks[row["rank"]].append((row["topic"], raw if row["topic"] == STEPS else decode(raw)))
    return ranks


def test_a_gpu_straggler_in_a_two_rank_job_is_named_with_its_kernel() -> None:
    # in a group of two the rank waiting for the suspect is flagged too: it is still the
    # kernels' reference (no peer at all left the anomaly at the step level)
    (a,) = load_bench("gpu").replay(_ranks(), "h200-straggler")
    assert (a.cause, list(a.ranks), a.end_step) == ("masked_compute_straggler", [1], 59)
    # rank 1's step 28 stood out 20 % too (the per-step detector flagged it): the change
    # points' onset may take it in
    assert 28 <= a.start_step <= 30
    assert a.level == "kernel", a.evidence
    spin = [v for k, v in a.evidence.items() if k.startswith("kernel:") and "spin_kernel" in k]
    assert spin and spin[0] > 1000, a.evidence  # ~250 ms against the peer's ~10 us
