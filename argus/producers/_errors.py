"""The producers package's error tree (one root: ``except ProducerError`` catches every one).

ProducerError              a producer cannot do what was asked
├── PublishError           the publisher cannot deliver (``drain`` found records lost)
│   └── KafkaSettingsError the librdkafka settings are invalid (the Publisher cannot start)
├── RelayError             the node relay cannot serve its socket
├── TraceError             a trace file cannot be imported (``producers.kineto``)
└── CsvError               a log CSV cannot be read as rank, time/step, value (also a ValueError)

``TraceError`` and ``CsvError`` are defined beside their importers
(:mod:`producers.kineto._errors`, :mod:`producers.csvlogs`); the
others here, re-exported where they are raised (``producers.publisher``,
``producers.relay``). Nothing here is raised into a training loop: the rank-side agent
and publisher count and log instead.
"""

from __future__ import annotations

__all__ = ["KafkaSettingsError", "ProducerError", "PublishError", "RelayError"]


class ProducerError(Exception):
    """Base class of every producers error."""


class PublishError(ProducerError):
    """The publisher cannot work (fatal client error), or ``drain`` found records lost."""


class KafkaSettingsError(PublishError):
    """The Kafka client settings are invalid: the publisher cannot be created."""


class RelayError(ProducerError):
    """The relay cannot serve its socket (served by a live relay, not a socket, not creatable)."""
