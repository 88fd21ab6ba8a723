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


def run_tty(args: list[str], home: Path, **env: str) -> tuple[int, bytes]:
    """Run the CLI with its stdout on a pseudo-terminal (what an analyst's terminal gets)."""
    import pty

    main, sub = pty.openpty()
    full = {**os.environ, "ARGUS_HOME": str(home), "COLUMNS": "160", **env}
    proc = subprocess.Popen([*ARGUS, *args], stdout=sub, stderr=subprocess.PIPE, env=full)
    os.close(sub)
    out = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(main)
    return proc.wait(timeout=180), out


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO anomalies (id, job, level, severity) VALUES ('forged', 'victim', 'hang', 'page')",
        "ALTER TABLE steps DELETE WHERE 1",
        "DROP TABLE steps",
        "SELECT * FROM file('/etc/passwd', 'LineAsString')",
        "INSERT INTO FUNCTION file('argus-sql-test.csv', 'CSV') SELECT 1",
        "SYSTEM SHUTDOWN",
        "SELECT 1 SETTINGS readonly = 0",
    ],
)
def test_sql_is_read_only_unless_asked_to_write(home: Path, statement: str) -> None:
    """Issue 34, item 9: INSERT of a forged page, ALTER ... DELETE, DROP TABLE, file() reads
    and writes were accepted, SYSTEM SHUTDOWN killed the process."""
    out = run(["sql", statement], home)
    assert out.returncode == 2 and "readonly" in out.stderr.lower(), (out.returncode, out.stdout, out.stderr)
    assert run(["sql", "SELECT count() FROM steps"], home).returncode == 0


def test_sql_writes_behind_the_write_flag(home: Path) -> None:
    query = "CREATE TABLE IF NOT EXISTS scratch (a UInt8) ENGINE = Memory; INSERT INTO scratch VALUES (7)"
    assert run(["sql", query], home).returncode == 2
    out = run(["sql", "--write", query], home)
    assert out.returncode == 0, out.stderr


def test_several_statements_give_one_result_each_with_its_own_columns(home: Path) -> None:
    """Issue 34, item 8: ``-f json "SELECT 10 AS first; SELECT 20 AS second"`` printed
    ``[{"second":10}]``."""
    out = run(["sql", "-f", "json", "SELECT 10 AS first; SELECT 20 AS second;"], home)
    assert out.returncode == 0, out.stderr
    assert [json.loads(ln) for ln in out.stdout.splitlines()] == [[{"first": 10}], [{"second": 20}]]
    out = run(["sql", "SELECT 'a;b' AS s -- one; two\n; /* ; */ SELECT 2 AS n"], home)
    assert out.stdout.splitlines() == ["s", "a;b", "", "n", "2"]


def test_escape_sequences_of_stored_names_never_reach_the_terminal(home: Path) -> None:
    """Issue 34, item 8: a job named ``ESC[2J...`` cleared the analyst's terminal through
    ``argus sql``; a ``--param`` with a backslash became a tab."""
    evil = "\x1b[2J\x1b]0;owned\x07C:\\runs\\new\\tjob"
    insert = run(
        [
            "sql",
            "--write",
            "-p",
            f"j={evil}",
            "INSERT INTO steps (job, run, step, rank) VALUES ({j:String}, 0, 0, 0)",
        ],
        home,
    )
    assert insert.returncode == 0, insert.stderr
    found = run(["sql", "-p", f"j={evil}", "SELECT count() AS n FROM steps WHERE job = {j:String}"], home)
    assert found.stdout.splitlines() == ["n", "1"]
    query = "SELECT job FROM steps WHERE job LIKE '%owned%'"
    for args in (["-f", "table"], ["-f", "tsv"], ["-f", "json"], ["-f", "csv"]):
        code, shown = run_tty(["sql", *args, query], home)
        assert code == 0
        assert b"\x1b[2J" not in shown and b"\x1b]0;" not in shown and b"\x07" not in shown, (args, shown)
        assert b"owned" in shown
    piped = run(["sql", "-f", "tsv", query], home)
    assert "\x1b[2J" in piped.stdout  # piped output is data, as ClickHouse wrote it


def test_report_finds_a_job_named_with_backslashes(home: Path, tmp_path: Path) -> None:
    """Issue 34, item 8: a stored job named ``C:\\runs\\new\\tjob`` could not be found by
    ``argus report`` (its parameters reached chDB unescaped)."""
    job = "C:\\runs\\new\\tjob"
    literal = job.replace("\\", "\\\\")  # stored as the sink stores it, not through a parameter
    insert = (
        "INSERT INTO steps (job, run, step, rank, time, start_ns, end_ns, step_ms) "
        f"SELECT '{literal}', 0, number, 0, now64(3), 0, 100000000, 100 FROM numbers(5)"
    )
    assert run(["sql", "--write", insert], home).returncode == 0
    assert (
        run(["sql", "SELECT count() FROM steps WHERE job = {j:String}", "-p", f"j={job}"], home).stdout
        == "count()\n5\n"
    )
    out = run(["report", "--job", job, "--output", str(tmp_path / "r.html")], home)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "r.html").stat().st_size > 1000


@pytest.mark.parametrize(
    "url",
    [
        "argus:S3cretPW@127.0.0.1:1",
        "http://argus:S3cret PW@127.0.0.1:1/x",
        "http://argus:S3cret%20PW@127.0.0.1:1/x",
        "https://argus:S3cret+PW@127.0.0.1:1",
    ],
)
def test_doctor_never_prints_the_clickhouse_password(tmp_path: Path, url: str) -> None:
    """Issue 34, item 10: a password in ARGUS_CLICKHOUSE_URL without a scheme, or with a space,
    was printed as is."""
    out = run(["doctor"], tmp_path, ARGUS_KAFKA_BOOTSTRAP="127.0.0.1:1", ARGUS_CLICKHOUSE_URL=url)
    assert out.returncode == 3
    text = out.stdout + out.stderr
    assert "S3cret" not in text and "PW@" not in text, text
    assert len([ln for ln in out.stdout.splitlines() if "│ ClickHouse " in ln]) == 1


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://argus:S3cretPW@127.0.0.1:abc/argus"])
def test_doctor_with_a_malformed_clickhouse_url_gives_one_line_and_exit_2(tmp_path: Path, url: str) -> None:
    """Issue 34, item 10: a bad port gave a 62-line traceback and exit 1."""
    out = run(["doctor"], tmp_path, ARGUS_KAFKA_BOOTSTRAP="127.0.0.1:1", ARGUS_CLICKHOUSE_URL=url)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "S3cret" not in out.stdout + out.stderr
    (line,) = [ln for ln in out.stdout.splitlines() if "│ ClickHouse " in ln]
    assert "INVALID" in line and "malformed" in line
