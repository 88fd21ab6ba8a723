"""`argus sql` behaves like clickhouse-client; `argus doctor` gives one line per part (real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from argus.cli.doctor import install_kind
from argus.cli.sql import format_clause, tsv_escape

ARGUS = [sys.executable, "-m", "argus.cli"]


def run(
    args: list[str], home: Path, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "ARGUS_HOME": str(home), **env}
    full.pop("COLUMNS", None)  # what a pipe gets: rich's 80 columns
    return subprocess.run([*ARGUS, *args], capture_output=True, text=True, env=full, input=stdin, timeout=180)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sql")


def test_a_format_clause_is_clickhouses_and_written_as_is(home: Path) -> None:
    out = run(["sql", "SELECT 1 AS a FORMAT JSONEachRow"], home)
    assert out.returncode == 0, out.stderr
    assert out.stdout == '{"a":1}\n'
    out = run(["sql", "SELECT number AS n, 'x' AS s FROM numbers(3) format CSVWithNames;"], home)
    assert out.stdout.splitlines() == ['"n","s"', '0,"x"', '1,"x"', '2,"x"']


def test_piped_output_is_tsv_with_a_header_never_wrapped(home: Path) -> None:
    wide = "y" * 300
    out = run(["sql", f"SELECT 1 AS a, 'tab\there' AS b, '{wide}' AS c, NULL AS d"], home)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["a\tb\tc\td", f"1\ttab\\there\t{wide}\t\\N"]


def test_json_writes_decimal_dates_and_uint64_exactly(home: Path) -> None:
    query = (
        "SELECT toDecimal64('1234567890.12', 2) AS d, toDate('2026-01-02') AS day, "
        "toUInt64(18446744073709551615) AS big"
    )
    out = run(["sql", "-f", "json", query], home)
    assert out.returncode == 0, out.stderr
    assert out.stdout == '[{"d":1234567890.12,"day":"2026-01-02","big":18446744073709551615}]\n'
    assert json.loads(out.stdout)[0]["big"] == 2**64 - 1
    lines = run(["sql", "-f", "jsonl", "SELECT number AS n FROM numbers(2)"], home).stdout.splitlines()
    assert lines == ['{"n":0}', '{"n":1}']


def test_dash_reads_the_query_from_stdin(home: Path) -> None:
    out = run(["sql", "-"], home, stdin="SELECT 6 * 7 AS answer\n")
    assert (out.returncode, out.stdout) == (0, "answer\n42\n")
    assert run(["sql", "-"], home, stdin="  \n").returncode == 2


def test_format_clause_and_tsv_escaping() -> None:
    assert format_clause("select 1 format JSONEachRow ;") == "JSONEachRow"
    assert format_clause("SELECT 'FORMAT x' AS f") is None
    assert tsv_escape("a\tb\nc\\") == "a\\tb\\nc\\\\" and tsv_escape(None) == "\\N"


def test_doctor_with_kafka_down_gives_kafka_one_line_and_the_fitting_hint(tmp_path: Path) -> None:
    out = run(["doctor"], tmp_path, ARGUS_KAFKA_BOOTSTRAP="127.0.0.1:1")
    assert out.returncode == 3
    text = out.stdout + out.stderr
    kafka = [ln for ln in text.splitlines() if "Kafka" in ln or "kafka" in ln.lower()]
    assert len([ln for ln in kafka if "│" in ln and ln.split("│")[1].strip() == "Kafka"]) == 1
    # no wrapped continuation rows, no client log lines: every table row names its part
    rows = [ln for ln in out.stdout.splitlines() if ln.startswith("│")]
    assert rows and all(ln.split("│")[1].strip() for ln in rows)
    assert "rdkafka" not in text and "%3|" not in text
    assert install_kind() == "source"  # this checkout
    assert "make kafka-up" in next(ln for ln in rows if ln.split("│")[1].strip() == "Kafka")


def test_the_terminal_table_shows_floats_without_binary_noise_and_tsv_keeps_them(home: Path) -> None:
    query = "SELECT toFloat64(34.876358675000006) AS x"
    table = run(["sql", query, "-f", "table"], home, COLUMNS="100")
    assert table.returncode == 0, table.stderr
    assert "34.876359" in table.stdout and "34.876358675" not in table.stdout
    tsv = run(["sql", query, "-f", "tsv"], home)
    assert tsv.stdout.splitlines()[1] == "34.876358675000006"
