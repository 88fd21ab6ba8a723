"""A Hugging Face ``Trainer`` on a tiny GPT-2 built in-process (a small config, no hub
download), one rank of a torchrun job on gloo, with ``argus.ArgusHFCallback``. Each rank
writes its step records to ``<out>/rank<r>.json``.

    torchrun --nproc-per-node 2 tests/frameworks/hf_job.py OUT_DIR [SLOW_RANK]
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import argus
from argus.schemas import StepBatch
from tests.helpers.sinks import ListSink

STEPS, BATCH, SEQ = 24, 4, 32


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Random token ids; the labels are the inputs (causal LM)."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 128, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Slow(GPT2LMHeadModel):
    """The straggler: 60 ms more compute per forward on one rank."""

    delay_s = 0.0

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.delay_s:
            time.sleep(self.delay_s)
        return super().forward(*args, **kwargs)


def main() -> None:
    out, slow = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else -1
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rank = int(os.environ["RANK"])
    model = Slow(GPT2Config(vocab_size=128, n_positions=SEQ, n_embd=64, n_layer=2, n_head=2))
    model.delay_s = 0.06 if rank == slow else 0.0
    sink = ListSink()
    args = TrainingArguments(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=BATCH,
        max_steps=STEPS,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        dataloader_num_workers=0,
        include_num_input_tokens_seen=True,
        disable_tqdm=True,
        remove_unused_columns=False,  # Slow.forward takes **kwargs
    )
    callback = argus.ArgusHFCallback(sink=sink, job="hf-test", heartbeat_s=1.0)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(STEPS * BATCH * 2), callbacks=[callback])
    trainer.train()
    agent = argus.api.attached()
    info = dataclasses.asdict(agent.info) if agent is not None else {}
    notes = dict(agent.hooks.notes) if agent is not None else {}
    argus.detach()
    rows = [dataclasses.asdict(r) for b in sink.of(StepBatch) for r in b.records()]
    (out / f"rank{rank}.json").write_text(json.dumps({"records": rows, "info": info, "notes": notes}))


if __name__ == "__main__":
    main()
