"""The narrow store interface over ClickHouse: embedded chDB or a ClickHouse server.

Both implementations take the same SQL (ClickHouse dialect) with bound parameters in
ClickHouse's ``{name:Type}`` syntax, so one DDL and one set of queries serve both::

    store = open_store(data_dir=".argus/clickhouse")          # chDB, file-backed
    store = open_store(url="http://user@clickhouse:8123/argus")  # a server
    store.query_rows("SELECT count() FROM steps WHERE job = {job:String}", {"job": "j1"})

A chDB data directory can be open in one process at a time: :class:`ChdbStore` takes an
advisory lock on it and raises :class:`StoreLockedError` naming the holder's PID when
another process has it, so the CLI can say so instead of printing a stack trace.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from ._errors import QueryError, SinkError, StoreLockedError, StoreUnavailableError

__all__ = ["ChdbStore", "ServerStore", "Store", "dedup_settings", "open_store", "split_statements"]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _ident(name: str) -> str:
    if not _IDENT.match(name):
        raise ValueError(f"not a table or column name: {name!r}")
    return name


def split_statements(script: str) -> list[str]:
    """Split a DDL script on ``;`` at line ends, dropping ``--`` comment lines."""
    lines = [ln for ln in script.splitlines() if not ln.lstrip().startswith("--")]
    return [s.strip() for s in re.split(r";\s*$", "\n".join(lines), flags=re.M) if s.strip()]


# ClickHouse error codes of a store that is there but cannot take the insert *now* (the
# same insert later may succeed): retried by the sink, like an unreachable store. Every
# other error is the store rejecting the statement or its data (QueryError), never retried.
_TRANSIENT_CODES = frozenset(
    {
        159,  # TIMEOUT_EXCEEDED
        202,  # TOO_MANY_SIMULTANEOUS_QUERIES
        209,  # SOCKET_TIMEOUT
        210,  # NETWORK_ERROR
        241,  # MEMORY_LIMIT_EXCEEDED
        242,  # TABLE_IS_READ_ONLY
        243,  # NOT_ENOUGH_SPACE
        252,  # TOO_MANY_PARTS
        319,  # UNKNOWN_STATUS_OF_INSERT
        425,  # SYSTEM_ERROR
        999,  # KEEPER_EXCEPTION
    }
)
_CODE = re.compile(r"Code: (\d+)")


def _store_error(message: str) -> SinkError:
    """The error for a failed statement: :class:`StoreUnavailableError` for a transient
    ClickHouse condition (retryable), else :class:`QueryError`."""
    m = _CODE.search(message)
    # 252 is also "Too many partitions for single INSERT block": that one is the data's fault.
    if m and int(m.group(1)) in _TRANSIENT_CODES and "single INSERT block" not in message:
        return StoreUnavailableError(message)
    return QueryError(message)


def dedup_settings(token: str) -> dict[str, Any]:
    """Insert settings that make a retried insert a no-op, in the table and in its views."""
    return {"insert_deduplication_token": token, "deduplicate_blocks_in_dependent_materialized_views": 1}


class Store(Protocol):
    """What Argus needs from ClickHouse."""

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        """Run a statement that returns nothing (DDL, INSERT ... SELECT)."""

    def query_rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Run a query and return its rows as tuples."""

    def query_arrow(self, sql: str, params: Mapping[str, Any] | None = None) -> pa.Table:
        """Run a query and return an Arrow table."""

    def insert_arrow(self, table: str, data: pa.Table, *, settings: Mapping[str, Any] | None = None) -> None:
        """Insert an Arrow table whose column names are the table's columns."""

    def close(self) -> None:
        """Release the store."""


def _settings_clause(settings: Mapping[str, Any] | None) -> str:
    if not settings:
        return ""
    parts = []
    for k, v in settings.items():
        value = f"'{v}'" if isinstance(v, str) else str(int(v) if isinstance(v, bool) else v)
        if isinstance(v, str) and not re.fullmatch(r"[A-Za-z0-9_.:/-]*", v):
            raise ValueError(f"setting {k} has an unsafe value")
        parts.append(f"{_ident(k)} = {value}")
    return " SETTINGS " + ", ".join(parts)


class ChdbStore:
    """ClickHouse in-process (chDB), file-backed under ``path``; one process at a time.

    Safe to share between threads (the sink's writer and a reader): queries take turns."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        import chdb.session  # imported here: the agent never needs it

        self._turn = threading.Lock()
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.path / "argus.lock", "a+")  # noqa: SIM115 - held for life
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.seek(0)
            holder = self._lock_file.read().strip() or "unknown"
            self._lock_file.close()
            raise StoreLockedError(
                f"the ClickHouse data directory {self.path} is in use by process {holder}; "
                "stop that process (e.g. `argus sink`) or point ARGUS_HOME elsewhere"
            ) from None
        self._lock_file.seek(0)
        self._lock_file.truncate()
        self._lock_file.write(str(os.getpid()))
        self._lock_file.flush()
        try:
            self._session = chdb.session.Session(str(self.path))  # type: ignore[no-untyped-call]
        except Exception as exc:
            self._release()
            if "Cannot lock file" in str(exc):
                raise StoreLockedError(f"the ClickHouse data directory {self.path} is in use") from exc
            if "already initialized with path" in str(exc):
                raise SinkError(
                    f"this process already has another chDB data directory open; chDB allows one "
                    f"per process (wanted {self.path})"
                ) from exc
            raise SinkError(f"cannot open chDB at {self.path}: {exc}") from exc

    def _query(self, sql: str, fmt: str, params: Mapping[str, Any] | None) -> Any:
        try:
            with self._turn:
                return self._session.query(sql, fmt, params=dict(params) if params else None)  # type: ignore[no-untyped-call]
        except Exception as exc:
            raise _store_error(str(exc).strip()) from exc

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        self._query(sql, "CSV", params)

    def query_arrow(self, sql: str, params: Mapping[str, Any] | None = None) -> pa.Table:
        result = self._query(sql, "ArrowTable", params)
        if not isinstance(result, pa.Table):  # statements without a result set
            return pa.table({})
        return result

    def query_rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        table = self.query_arrow(sql, params)
        return list(zip(*(c.to_pylist() for c in table.columns), strict=True))

    def insert_arrow(self, table: str, data: pa.Table, *, settings: Mapping[str, Any] | None = None) -> None:
        cols = ", ".join(_ident(c) for c in data.column_names)
        # chDB's Python() table function reads the local variable named in the SQL.
        arrow_input = data  # noqa: F841 - referenced by name inside the SQL
        self._query(
            f"INSERT INTO {_ident(table)} ({cols}){_settings_clause(settings)} "
            f"SELECT {cols} FROM Python(arrow_input)",
            "CSV",
            None,
        )

    def _release(self) -> None:
        with contextlib.suppress(OSError):
            self._lock_file.seek(0)
            self._lock_file.truncate()
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._session.close()  # type: ignore[no-untyped-call]
        self._release()


class ServerStore:
    """A ClickHouse server through clickhouse-connect (HTTP/HTTPS)."""

    def __init__(
        self,
        url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        database: str | None = None,
        secure: bool | None = None,
        ca_cert: str | None = None,
    ) -> None:
        import clickhouse_connect
        from clickhouse_connect.driver.exceptions import ClickHouseError, OperationalError

        self._retryable: tuple[type[BaseException], ...] = (OperationalError,)
        self._errors: tuple[type[BaseException], ...] = (ClickHouseError,)
        kwargs: dict[str, Any] = {"dsn": url}
        if username:
            kwargs["username"] = username
        if password:
            kwargs["password"] = password
        if database:
            kwargs["database"] = database
        if secure is not None:
            kwargs["secure"] = secure
        if ca_cert:
            kwargs["ca_cert"] = ca_cert
        try:
            self._client = clickhouse_connect.get_client(**kwargs)
        except self._retryable as exc:
            raise StoreUnavailableError(f"ClickHouse server unreachable: {exc}") from exc
        except self._errors as exc:
            raise SinkError(f"ClickHouse server refused the connection: {exc}") from exc

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except self._retryable as exc:
            raise StoreUnavailableError(str(exc)) from exc
        except self._errors as exc:
            raise _store_error(str(exc)) from exc

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        self._call(self._client.command, sql, parameters=dict(params or {}))

    def query_rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        result = self._call(self._client.query, sql, parameters=dict(params or {}))
        return [tuple(r) for r in result.result_rows]

    def query_arrow(self, sql: str, params: Mapping[str, Any] | None = None) -> pa.Table:
        return self._call(self._client.query_arrow, sql, parameters=dict(params or {}))

    def insert_arrow(self, table: str, data: pa.Table, *, settings: Mapping[str, Any] | None = None) -> None:
        self._call(self._client.insert_arrow, _ident(table), data, settings=dict(settings or {}))

    def close(self) -> None:
        self._client.close()


def open_store(
    *, url: str | None = None, data_dir: str | os.PathLike[str] | None = None, **server: Any
) -> Store:
    """A server store when ``url`` is given, else chDB under ``data_dir``."""
    if url:
        return ServerStore(url, **server)
    if data_dir is None:
        raise ValueError("open_store needs a url or a data_dir")
    return ChdbStore(data_dir)
