"""A 2-process Lightning ``Trainer(strategy="ddp", accelerator="cpu")`` with
``argus.ArgusLightningCallback``; Lightning starts the second rank itself (it re-runs this
script). Each rank writes its step records to ``<out>/rank<r>.json``.

    python tests/frameworks/lightning_job.py OUT_DIR [SLOW_RANK]
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

import argus
from argus.schemas import StepBatch
from tests.helpers.sinks import ListSink

STEPS, BATCH, DIM = 24, 8, 256


class Net(pl.LightningModule):
    def __init__(self, slow_rank: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(*[torch.nn.Linear(DIM, DIM) for _ in range(4)])
        self.slow_rank = slow_rank

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_rank == self.slow_rank:
            time.sleep(0.06)  # the straggler: 60 ms more compute per step
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x).mean(dim=1), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def main() -> None:
    out, slow = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else -1
    torch.set_num_threads(1)
    sink = ListSink()
    data = TensorDataset(torch.randn(STEPS * BATCH * 2, DIM), torch.randn(STEPS * BATCH * 2))
    trainer = pl.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_steps=STEPS,
        callbacks=[argus.ArgusLightningCallback(sink=sink, job="lightning-test", heartbeat_s=1.0)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Net(slow), DataLoader(data, batch_size=BATCH))
    agent = argus.api.attached()
    info = dataclasses.asdict(agent.info) if agent is not None else {}
    argus.detach()
    rows = [dataclasses.asdict(r) for b in sink.of(StepBatch) for r in b.records()]
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps({"records": rows, "info": info}))


if __name__ == "__main__":
    main()
