"""The argus package's error tree (one root: ``except ArgusError`` catches every one).

ArgusError                 the composition root cannot do what was asked
├── ConfigError            a setting has a value Argus cannot use (also a ValueError)
├── KafkaUnavailable       the broker cannot be reached or refused us
└── DemoError              the demo could not complete

Each class lives beside the code that raises it (``argus.config``,
``argus.kafka_admin``, ``argus.demo``). The other packages have their
own roots (``SchemaError``, ``ProducerError``, ``SinkError``; detectors and streams raise
only ``ValueError`` for caller misuse); the ``argus`` command maps all of them to exit
codes in one table, :mod:`argus.cli._errors`.
"""

from __future__ import annotations

__all__ = ["ArgusError"]


class ArgusError(Exception):
    """Base class of every error the ``argus`` package defines."""
