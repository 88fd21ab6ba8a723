"""The narrow store interface over ClickHouse: embedded chDB or a ClickHouse server.

Both implementations take the same SQL (ClickHouse dialect) with bound parameters in
ClickHouse's ``{name:Type}`` syntax, so one DDL and one set of queries serve both::

    store = open_store(data_dir=".argus/clickhouse")          # chDB, file-backed
    store = open_store(url="http://user@clickhouse:8123/argus")  # a server
    store.query_rows("SELECT count() FROM steps WHERE job = {job:String}", {"job": "j1"})
    for chunk in store.query_raw("SELECT * FROM steps FORMAT JSONEachRow"):  # ClickHouse's bytes
        sys.stdout.buffer.write(chunk)

Arrow results carry ``DateTime`` columns as timestamps (ClickHouse's Arrow output writes them
as epoch ``UInt32``; :func:`with_datetimes` puts the type back), so a reader sees the times
clickhouse-client prints, in the column's time zone.

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
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from ._errors import QueryError, SinkError, StoreLockedError, StoreUnavailableError

__all__ = [
    "ChdbStore",
    "ServerStore",
    "Store",
    "dedup_settings",
    "open_store",
    "split_statements",
    "with_datetimes",
]

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


_DATETIME = re.compile(r"^DateTime(?:\('([^']*)'\))?$")
_WRAPPERS = re.compile(r"^(?:Nullable|LowCardinality)\((.*)\)$")
_SIMPLE_AGGREGATE = re.compile(r"^SimpleAggregateFunction\(\s*\w+\s*,\s*(.*)\)$")
_ARRAY = re.compile(r"^Array\((.*)\)$")


def _datetime_arrow_type(ch_type: str, default_tz: str) -> pa.DataType | None:
    """The Arrow type a ClickHouse ``DateTime`` column (bare, Nullable, in an Array...) should
    have, or None for any other type (those come out of Arrow as they should)."""
    t = ch_type.strip()
    while True:
        m = _WRAPPERS.match(t) or _SIMPLE_AGGREGATE.match(t)
        if not m:
            break
        t = m.group(1).strip()
    m = _ARRAY.match(t)
    if m:
        inner = _datetime_arrow_type(m.group(1), default_tz)
        return None if inner is None else pa.list_(inner)
    m = _DATETIME.match(t)
    if m:
        return pa.timestamp("s", tz=m.group(1) or default_tz)
    return None


def _has_uint32(t: pa.DataType) -> bool:
    return t == pa.uint32() or (pa.types.is_list(t) and _has_uint32(t.value_type))


def _as_int64(t: pa.DataType) -> pa.DataType:
    return pa.list_(_as_int64(t.value_type)) if pa.types.is_list(t) else pa.int64()


def with_datetimes(table: pa.Table, types: Mapping[str, str], default_tz: str) -> pa.Table:
    """``table`` with its ``DateTime`` columns as Arrow timestamps (seconds, the column's time
    zone or ``default_tz``, the server's) instead of the epoch ``UInt32`` that ClickHouse's
    Arrow output writes; ``types`` maps column names to their ClickHouse types (``DESCRIBE``)."""
    for i, field in enumerate(table.schema):
        target = _datetime_arrow_type(types.get(field.name, ""), default_tz)
        if target is None or not _has_uint32(field.type):
            continue
        column = table.column(i).cast(_as_int64(field.type)).cast(target)
        table = table.set_column(i, pa.field(field.name, target, field.nullable), column)
    return table


def _describable(sql: str) -> str:
    """The query as a ``DESCRIBE (...)`` subquery: without its trailing ``;``."""
    return sql.strip().rstrip(";").rstrip()


def dedup_settings(token: str) -> dict[str, Any]:
    """Insert settings that make a retried insert a no-op, in the table and in its views."""
    return {"insert_deduplication_token": token, "deduplicate_blocks_in_dependent_materialized_views": 1}


def _restore_datetimes(
    store: ChdbStore | ServerStore, sql: str, params: Mapping[str, Any] | None, result: pa.Table
) -> pa.Table:
    """``result`` with its ``DateTime`` columns as timestamps: Arrow carries them as UInt32, so
    a result with a UInt32 column asks ClickHouse for the column types (``DESCRIBE`` and the
    server's time zone, the one clickhouse-client shows a zone-less ``DateTime`` in; both
    answer in String columns, so this never recurses)."""
    if not any(_has_uint32(f.type) for f in result.schema):
        return result
    try:
        described = store.query_rows(f"DESCRIBE ({_describable(sql)})", params)
    except QueryError:  # not a SELECT (SHOW, EXPLAIN...): no DateTime to restore
        return result
    if store._tz is None:
        store._tz = str(store.query_rows("SELECT timezone()")[0][0])
    return with_datetimes(result, {str(r[0]): str(r[1]) for r in described}, store._tz)


class Store(Protocol):
    """What Argus needs from ClickHouse."""

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        """Run a statement that returns nothing (DDL, INSERT ... SELECT)."""

    def query_rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Run a query and return its rows as tuples."""

    def query_arrow(self, sql: str, params: Mapping[str, Any] | None = None) -> pa.Table:
        """Run a query and return an Arrow table (``DateTime`` columns as timestamps)."""

    def query_raw(
        self, sql: str, params: Mapping[str, Any] | None = None, *, fmt: str = "TabSeparatedWithNames"
    ) -> Iterator[bytes]:
        """Run a query and yield ClickHouse's output bytes as they come: in the format its own
        ``FORMAT`` clause names, else in ``fmt``."""

    def insert_arrow(self, table: str, data: pa.Table, *, settings: Mapping[str, Any] | None = None) -> None:
        """Insert an Arrow table whose column names are the table's columns."""

    def read_only(self) -> None:
        """From now on refuse every write on this connection (``readonly=1``: no INSERT,
        ALTER, DROP, SYSTEM, no ``file()``/``url()`` table functions, no setting may lift it)."""

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


_PARAM_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\\0"})


def _escaped(params: Mapping[str, Any]) -> dict[str, Any]:
    """Bound parameters as chDB wants them: it parses a value in ClickHouse's escaped text
    format (``run\\t1`` would become a tab, a lone backslash or a newline an error), so a
    string's backslashes and control characters are escaped and it reads back as given
    (clickhouse-connect does the same for a server)."""
    return {k: v.translate(_PARAM_ESCAPES) if isinstance(v, str) else v for k, v in params.items()}


class ChdbStore:
    """ClickHouse in-process (chDB), file-backed under ``path``; one process at a time.

    Safe to share between threads (the sink's writer and a reader): queries take turns."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        import chdb.session  # imported here: the agent never needs it

        self._turn = threading.Lock()
        self._tz: str | None = None
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
                return self._session.query(sql, fmt, params=_escaped(params) if params else None)  # type: ignore[no-untyped-call]
        except Exception as exc:
            raise _store_error(str(exc).strip()) from exc

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        self._query(sql, "CSV", params)

    def query_arrow(self, sql: str, params: Mapping[str, Any] | None = None) -> pa.Table:
        """Run a query and return an Arrow table (``DateTime`` columns as timestamps)."""
        result = self._query(sql, "ArrowTable", params)
        if not isinstance(result, pa.Table):  # statements without a result set
            return pa.table({})
        return _restore_datetimes(self, sql, params, result)

    def query_raw(
        self, sql: str, params: Mapping[str, Any] | None = None, *, fmt: str = "TabSeparatedWithNames"
    ) -> Iterator[bytes]:
        """Run a query and yield ClickHouse's output bytes: in the format its own ``FORMAT``
        clause names, else in ``fmt`` (chDB runs in this process: one chunk)."""
        yield self._query(sql, fmt, params).bytes()

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

    def read_only(self) -> None:
        """Refuse every write from now on in this process's session (``SET readonly = 1``)."""
        self.execute("SET readonly = 1")

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
        self._tz: str | None = None
        self._kwargs = kwargs
        self._client = self._connect(kwargs)

    def _connect(self, kwargs: dict[str, Any]) -> Any:
        import clickhouse_connect

        try:
            return clickhouse_connect.get_client(**kwargs)
        except ValueError as exc:  # e.g. a port out of range or not a number: the setting's fault
            raise ValueError(f"the ClickHouse URL is malformed: {exc}") from None
        except self._retryable as exc:
            raise StoreUnavailableError(f"ClickHouse server unreachable: {exc}") from exc
        except self._errors as exc:
            raise SinkError(f"ClickHouse server refused the connection: {exc}") from exc

    def read_only(self) -> None:
        """Reconnect with ``readonly=1`` on every request: the client learns at connect that
        no setting can change, so it sends none (with ``readonly=2`` it could, and
        ``file()`` would read the server's files)."""
        client = self._connect({**self._kwargs, "settings": {"readonly": 1}})
        self._client.close()
        self._client = client

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
        """Run a query and return an Arrow table (``DateTime`` columns as timestamps)."""
        result: pa.Table = self._call(self._client.query_arrow, sql, parameters=dict(params or {}))
        return _restore_datetimes(self, sql, params, result)

    def query_raw(
        self, sql: str, params: Mapping[str, Any] | None = None, *, fmt: str = "TabSeparatedWithNames"
    ) -> Iterator[bytes]:
        """Run a query and yield the server's output bytes as the HTTP response brings them: in
        the format its own ``FORMAT`` clause names, else in ``fmt``."""
        stream = self._call(self._client.raw_stream, sql, parameters=dict(params or {}), fmt=fmt)
        read = getattr(stream, "read1", None) or stream.read  # read1: what has arrived, not 64 KiB
        try:
            while chunk := self._call(read, 1 << 16):
                yield bytes(chunk)
        finally:
            stream.close()

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
