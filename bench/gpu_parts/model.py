"""The GPU check's model and loop: a small GPT built from a :class:`Size`, its training step
with the agent's phase marks, and the agent publishing into memory (the GPU machine has no
broker)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Size:
    """The model and the run lengths of one size of the check."""

    vocab: int
    dim: int
    layers: int
    heads: int
    seq: int
    batch: int
    steps: int  # cupti and events
    rounds: int  # overhead
    block: int  # steps per overhead block (a multiple of the agent's kernel_every)
    straggler_steps: int
    nvml_s: float


SIZES = {
    "full": Size(16384, 1024, 12, 16, 1024, 8, 64, 10, 32, 90, 30.0),
    "quick": Size(8192, 512, 6, 8, 512, 8, 30, 6, 16, 60, 10.0),
    "smoke": Size(512, 64, 2, 4, 32, 2, 6, 1, 2, 24, 1.0),
}


def build(size: Size, device: str) -> tuple[Any, Any, list[tuple[Any, Any]]]:
    """The GPT, its AdamW and a few batches of token ids on ``device``."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = size.dim
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x: Any) -> Any:
            b, t, d = x.shape
            h = size.heads
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(size.vocab, size.dim)
            self.pos = nn.Embedding(size.seq, size.dim)
            self.blocks = nn.Sequential(*[Block() for _ in range(size.layers)])
            self.ln = nn.LayerNorm(size.dim)
            self.head = nn.Linear(size.dim, size.vocab, bias=False)

        def forward(self, idx: Any, targets: Any) -> Any:
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            logits = self.head(self.ln(self.blocks(x)))
            return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    torch.manual_seed(0)
    model = GPT().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    data = [
        (
            torch.randint(0, size.vocab, (size.batch, size.seq), generator=g).to(device),
            torch.randint(0, size.vocab, (size.batch, size.seq), generator=g).to(device),
        )
        for _ in range(4)
    ]
    return model, opt, data


def train_step(
    model: Any,
    opt: Any,
    batch: tuple[Any, Any],
    *,
    marks: bool = False,
    slow: int = 0,
    before_step: Any = None,
) -> None:
    """One step (bf16 autocast on CUDA); ``marks``: each phase in a ``record_function``;
    ``slow``: GPU cycles of busy-wait before the forward (a slowed GPU)."""
    import torch

    mark = torch.profiler.record_function if marks else (lambda _n: contextlib.nullcontext())
    device = batch[0].device.type
    with mark("argus.forward"):
        if slow and device == "cuda":
            torch.cuda._sleep(slow)  # every rank runs it: a kernel the peers share, slower on one
        elif slow:
            time.sleep(slow / 2e9)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(*batch)
    with mark("argus.backward"):
        loss.backward()
    if before_step is not None:
        before_step()
    with mark("argus.optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)


class ListSink:
    """The agent's sink, in memory: (topic, record) in publishing order."""

    def __init__(self) -> None:
        self.items: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def publish(self, topic: str, key: bytes, record: Any) -> None:
        """Keep the record."""
        with self._lock:
            self.items.append((topic, record))


def new_agent(sink: ListSink, rank: int = 0, world: int = 1, **cfg: Any) -> Any:
    """A rank agent as ``argus.attach`` builds it (heartbeats every second), not installed."""
    from argus.producers.agent import AgentConfig, RankAgent, RankInfo

    info = RankInfo("gpu-check", 0, rank, world, 0, socket.gethostname())
    return RankAgent(sink, info, AgentConfig(heartbeat_s=1.0, **cfg))


def sync_device(device: str) -> None:
    """Wait for the GPU's queued work (nothing on the CPU)."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def steps_of(sink: ListSink) -> dict[int, Any]:
    """The step rows the agent published, by step (decoded from their wire bytes)."""
    from argus.schemas import STEPS, decode

    out = {}
    for topic, rec in sink.items:
        if topic == STEPS:
            b = decode(rec)
            out[int(b.step)] = b
    return out
