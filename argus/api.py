"""The public API of the rank agent: one line in a training script.

    import argus
    argus.attach(model, optimizer)            # plain loop: the optimizer step ends a step
    for batch in loader:
        with argus.step(tokens=n):            # or mark steps yourself
            ...
        with argus.pause("checkpoint"):       # no step for a while, on purpose: not a hang
            save(model)

``attach`` reads settings like every Argus entry point (``ARGUS_*``, config file, keyword
overrides), learns rank, world, host and the parallel layout from torch.distributed and
the launcher's environment (overridable), hooks PyTorch, starts the agent's thread and the
publisher (bounded queue, disk spool under ``settings.spool_dir``). Until ``attach`` is
called, ``step()`` is a no-op; nothing here raises into the training loop after a
successful ``attach`` (bad arguments to ``attach`` itself raise ``ValueError``).

Framework callbacks (import-guarded, built on first access): ``ArgusLightningCallback``
for PyTorch Lightning and ``ArgusHFCallback`` for the Hugging Face ``Trainer``.

After ``fork()`` (DataLoader workers on Linux) the child inherits the agent but none of its
threads: it undoes the hooks, drops what it inherited (spans, finished steps, the
publisher) and records nothing unless it calls ``attach`` itself.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import sys
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from argus.producers.agent import AgentConfig, RankAgent, detect_rank_info, framework_layout

from .config import ConfigError, Settings, load_settings, redact_url

__all__ = [
    "StepCallbacks",
    "attach",
    "attached",
    "detach",
    "pause",
    "step",
]

log = logging.getLogger("argus.api")

_SETTINGS = frozenset(f.name for f in dataclasses.fields(Settings))
_AGENT = frozenset(f.name for f in dataclasses.fields(AgentConfig))
_LAYOUT = frozenset({"rank", "world", "run", "host", "gpu_uuid", "tp_size", "pp_size", "coords"})
_FRAMEWORK = frozenset({"mesh"})
PUBLISHER_WAKE_MS = 2000
"""How often the rank's publisher thread wakes on its own (delivery reports, the spool's
replay): the agent wakes it after each of its rounds (``publish_s``, 1 s), so a record
leaves in the round it was made, heartbeats and declared pauses included, and a step
record at most ~1 s after its step ended. Each wake-up costs CPU the training process may
need."""
_lock = threading.Lock()
_agent: RankAgent | None = None
_publisher: Any = None


def attached() -> RankAgent | None:
    """The running agent, or None."""
    return _agent


def attach(model: Any = None, optimizer: Any = None, *, sink: Any = None, **settings: Any) -> RankAgent:
    """Start the agent in this process (once; later calls return the running agent).

    Args:
        model: the root ``nn.Module`` (forward time); None skips forward timing.
        optimizer: its optimizer (optimizer time; its step ends a training step unless
            ``argus.step()`` marks steps).
        sink: where records go instead of a Kafka publisher (anything with ``publish``).
        **settings: ``Settings`` fields (``job``, ``kafka_bootstrap``, ``home``, ...),
            ``AgentConfig`` fields (``stack_hz``, ``heartbeat_s``, ``cupti``, ...) and the
            layout (``rank``, ``world``, ``run``, ``host``, ``gpu_uuid``, ``tp_size``,
            ``pp_size``, ``coords={"dp": ..}``, ``mesh=`` a ``DeviceMesh``). Without
            ``tp_size``/``pp_size``/``coords`` the layout comes from the framework: the
            ``mesh`` or the model's DTensor mesh, Megatron-Core, DeepSpeed.

    Returns:
        The :class:`~producers.agent.RankAgent` (``.info``, ``.absent``, ``.step``).

    Raises:
        ValueError: an unknown keyword, a bad layout or agent setting; its subclass
            :class:`~argus.config.ConfigError` for a setting Argus cannot use (from the
            environment, the config file or a keyword), invalid Kafka client settings
            included, and a spool directory that cannot be created. Nothing else: the agent
            and the publisher start without contacting the broker.
    """
    global _agent, _publisher
    with _lock:
        if _agent is not None:
            return _agent
        unknown = set(settings) - _SETTINGS - _AGENT - _LAYOUT - _FRAMEWORK
        if unknown:
            raise ValueError(f"unknown argus.attach settings: {sorted(unknown)}")
        conf = load_settings(**{k: v for k, v in settings.items() if k in _SETTINGS})
        agent_conf = AgentConfig(**{k: v for k, v in settings.items() if k in _AGENT})
        job = conf.job or os.environ.get("TORCHELASTIC_RUN_ID") or "local"
        layout = {k: v for k, v in settings.items() if k in _LAYOUT}
        rank_guess = detect_rank_info(job, **layout).rank
        found = framework_layout(model, settings.get("mesh"), rank=rank_guess)
        info = detect_rank_info(job, framework=found, **layout)
        custom_sink = sink is not None
        if sink is None:
            from argus.producers.publisher import KafkaSettingsError, Publisher

            spool = conf.spool_dir / f"{info.job}-{info.run}-r{info.rank}"
            try:
                sink = _publisher = Publisher(
                    conf.kafka_client_config(),
                    spool_dir=spool,
                    relay=conf.relay_socket or None,
                    wake_ms=PUBLISHER_WAKE_MS,
                    background=True,
                )
            except KafkaSettingsError as exc:  # the settings are the caller's: a ValueError
                raise ConfigError(str(exc)) from exc
            except OSError as exc:  # ARGUS_HOME not writable on this machine
                raise ConfigError(f"cannot create the spool {spool}: {exc.strerror or exc}") from exc
        agent = RankAgent(sink, info, agent_conf)
        agent.install(model, optimizer)
        _agent = agent
        atexit.register(detach)
        _register_fork_handler()
        for layer, reason in agent.absent.items():
            log.info("argus: %s absent: %s", layer, reason)
        if info.rank == 0 and not conf.quiet:
            _announce(agent, conf, custom_sink=custom_sink)
        return agent


def _announce(agent: RankAgent, conf: Settings, *, custom_sink: bool) -> None:
    """One line on stderr (rank 0 only, not per rank): what is attached and where its records
    go, so a user sees that the one line they added works."""
    info = agent.info
    if custom_sink:
        to = f"to {type(agent.sink).__name__}"
    elif conf.relay_socket:
        to = f"through the node relay {conf.relay_socket}"
    else:
        to = f"to Kafka {redact_url(conf.kafka_bootstrap)}"
    absent = f"; absent here: {', '.join(sorted(agent.absent))}" if agent.absent else ""
    with contextlib.suppress(Exception):  # a closed stderr never stops training
        print(
            f"argus: attached to job {info.job!r} run {info.run} ({info.world} rank(s)); "
            f"step records {to}{absent} (ARGUS_QUIET=1 silences this line)",
            file=sys.stderr,
            flush=True,
        )


def detach(timeout: float = 10.0) -> dict[str, Any]:
    """Stop the agent, deliver or spool what is left within ``timeout``; the publisher's counters."""
    global _agent, _publisher
    with _lock:
        agent, publisher = _agent, _publisher
        _agent = _publisher = None
    if agent is not None:
        try:
            agent.close(timeout=min(timeout, 5.0))
        except Exception:
            log.warning("argus: closing the agent failed", exc_info=True)
    if publisher is not None:
        publisher.shutdown(timeout)
        return dict(publisher.stats())
    return {}


_fork_registered = False


def _register_fork_handler() -> None:
    global _fork_registered
    if not _fork_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_registered = True


def _after_fork_in_child() -> None:
    """In a forked child: forget the parent's agent and publisher without touching their
    threads (they do not exist here) or their Kafka client (unusable after fork)."""
    global _agent, _publisher, _lock
    _lock = threading.Lock()  # the parent may have held it while forking
    agent, _agent, _publisher = _agent, None, None
    if agent is not None:
        with contextlib.suppress(Exception):
            agent.reset_after_fork()


@contextlib.contextmanager
def pause(reason: str = "checkpoint", max_seconds: float = 3600.0) -> Iterator[None]:
    """Declare work that completes no step (``with argus.pause("checkpoint"):``) so the hang
    detector does not page for it; it counts for at most ``max_seconds``. No-op if not attached."""
    a = _agent
    if a is not None:
        a.declare_pause(reason, max_seconds)
    try:
        yield
    finally:
        if a is not None:
            a.end_pause()


class step:
    """Mark one training step (``with argus.step(samples=.., tokens=..):``); no-op if not attached."""

    __slots__ = ("samples", "tokens")

    def __init__(self, samples: int = 0, tokens: int = 0) -> None:
        self.samples = samples
        self.tokens = tokens

    def __enter__(self) -> step:
        a = _agent
        if a is not None:
            a.begin_step()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        a = _agent
        if a is not None:
            a.end_step(self.samples, self.tokens)


class StepCallbacks:
    """The logic of the framework callbacks: attach at train start, one step per batch."""

    def __init__(self, **settings: Any) -> None:
        self.settings = settings

    def train_begin(self, model: Any, optimizers: Any) -> None:
        """Attach with the framework's model and its optimizer (if it has exactly one;
        an accelerate/Lightning wrapper is unwrapped to the torch optimizer it drives)."""
        opts = list(optimizers or [])
        opt = opts[0] if len(opts) == 1 else None
        inner = getattr(opt, "optimizer", None)
        if inner is not None and hasattr(inner, "register_step_pre_hook"):
            opt = inner
        attach(model, opt, **self.settings)

    def batch_begin(self) -> None:
        """A training step starts."""
        a = _agent
        if a is not None:
            a.begin_step()

    def batch_end(self, samples: int = 0, tokens: int = 0) -> None:
        """The training step ends."""
        a = _agent
        if a is not None:
            a.end_step(samples, tokens)


def _batch_size(batch: Any) -> int:
    """Samples in a batch: the length of its first tensor (0 if there is none)."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()), None)
    elif isinstance(batch, list | tuple):
        batch = batch[0] if batch else None
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape else 0


def _lightning_callback() -> type:
    try:
        import lightning.pytorch as pl
    except ImportError:
        try:
            import pytorch_lightning as pl  # type: ignore[no-redef,unused-ignore]
        except ImportError:
            raise ImportError(
                "ArgusLightningCallback needs PyTorch Lightning: pip install lightning"
            ) from None

    class ArgusLightningCallback(pl.Callback, StepCallbacks):  # type: ignore[misc,unused-ignore]
        """Lightning callback: ``Trainer(callbacks=[argus.ArgusLightningCallback()])``."""

        def __init__(self, **settings: Any) -> None:
            pl.Callback.__init__(self)
            StepCallbacks.__init__(self, **settings)

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            # the strategy's model (DDP, FSDP) runs the training step in its forward
            model = getattr(getattr(trainer, "strategy", None), "model", None) or pl_module
            self.train_begin(model, trainer.optimizers)

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            self.batch_begin()

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            self.batch_end(samples=_batch_size(batch))

    return ArgusLightningCallback


def _hf_callback() -> type:
    try:
        from transformers import TrainerCallback
    except ImportError:
        raise ImportError(
            "ArgusHFCallback needs Hugging Face transformers: pip install transformers"
        ) from None

    class ArgusHFCallback(TrainerCallback, StepCallbacks):  # type: ignore[misc,unused-ignore]
        """Trainer callback: ``Trainer(..., callbacks=[argus.ArgusHFCallback()])``."""

        def __init__(self, **settings: Any) -> None:
            StepCallbacks.__init__(self, **settings)
            self._tokens_seen = 0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            opt = kwargs.get("optimizer")
            self.train_begin(kwargs.get("model"), [opt] if opt is not None else [])
            self._tokens_seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.batch_begin()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            # one step = one optimizer step: the per-device batch times accumulation; tokens
            # when the Trainer counts them (include_num_input_tokens_seen), which it sums
            # over all ranks: this rank's share
            samples = int(args.per_device_train_batch_size) * int(args.gradient_accumulation_steps)
            seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
            tokens, self._tokens_seen = max(seen - self._tokens_seen, 0), seen
            self.batch_end(samples=samples, tokens=tokens // max(int(args.world_size), 1))

    return ArgusHFCallback


_LAZY = {"ArgusLightningCallback": _lightning_callback, "ArgusHFCallback": _hf_callback}
_built: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        if name not in _built:
            _built[name] = _LAZY[name]()
        return _built[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
