"""The schemas package's error tree.

    SchemaError                  anything wrong with bytes or records on a topic
    ├── DecodeError              not the Confluent wire format, or not valid Avro
    │   └── UnknownSchemaError   a schema id this build does not know
    └── ValidationError          decoded fine, but the values are out of range (NaN, negative, absurd)

Every error carries a short ``reason`` (a stable word for counters and dead-letter headers).
"""

from __future__ import annotations

__all__ = ["DecodeError", "SchemaError", "UnknownSchemaError", "ValidationError"]


class SchemaError(Exception):
    """Base class: bytes or a record that does not fit the contract."""

    reason = "schema"


class DecodeError(SchemaError):
    """The bytes are not a record in the Confluent wire format with a known Avro schema."""

    reason = "decode"


class UnknownSchemaError(DecodeError):
    """The wire header names a schema id that this build does not know."""

    reason = "unknown_schema"


class ValidationError(SchemaError):
    """The record decoded but holds values outside the contract's ranges."""

    reason = "invalid"
