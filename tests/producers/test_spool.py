"""The spool under crashes and full disks (issue 17 items 7 and 8): framing, torn tails,
bytes on disk, a replay's cursor across prepends, private files."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

from argus.producers.spool import Spool

REPO = Path(__file__).resolve().parents[2]


def recs(a: int, b: int, topic: str = "argus.steps") -> list[tuple[str, bytes, bytes]]:
    return [(topic, b"k%d" % i, b"v%d" % i) for i in range(a, b)]


def on_disk(d: Path) -> int:
    return sum(p.stat().st_size for p in d.glob("*.seg"))


def test_records_appended_after_a_torn_tail_are_not_lost(tmp_path: Path) -> None:
    """A crash mid-write leaves half a record; a new process appends after it: the new
    records must read back intact (before: a topic 'argus.st\\x00\\x10\\x00' and 2 lost)."""
    s = Spool(tmp_path)
    s.append(recs(0, 3))
    seg = next(tmp_path.glob("*.seg"))
    whole = seg.read_bytes()
    s.append(recs(3, 4))
    seg.write_bytes(seg.read_bytes()[: len(whole) + 7])  # the 4th record torn after 7 bytes
    again = Spool(tmp_path)
    assert len(again) == 3
    assert again.append(recs(10, 12)) == 0
    got = again.read(100)
    assert got == recs(0, 3) + recs(10, 12)
    assert again.bytes == on_disk(tmp_path)
    again.commit()
    assert not list(tmp_path.glob("*.seg")) and again.bytes == 0


def test_garbage_in_a_segment_never_raises_and_keeps_later_segments(tmp_path: Path) -> None:
    """Bytes that parse as a header with a non-UTF-8 topic (before: every read() raised
    UnicodeDecodeError and everything stayed spooled)."""
    s = Spool(tmp_path)
    s.append(recs(0, 2))
    seg = next(tmp_path.glob("*.seg"))
    seg.write_bytes(
        seg.read_bytes() + b"\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\xff\xfe\xfd\xfc" + bytes(64)
    )
    again = Spool(tmp_path)
    again.append(recs(2, 4))
    assert again.read(100) == recs(0, 4)
    assert again.torn_bytes > 0


def test_a_flipped_bit_is_caught_by_the_checksum(tmp_path: Path) -> None:
    s = Spool(tmp_path)
    s.append(recs(0, 3))
    seg = next(tmp_path.glob("*.seg"))
    data = bytearray(seg.read_bytes())
    data[-1] ^= 0x01  # the last value's last byte
    seg.write_bytes(bytes(data))
    assert Spool(tmp_path).read(100) == recs(0, 2)


_DISK_FULL = r"""
import json, os, resource, signal, sys
from pathlib import Path
from argus.producers.spool import Spool

d = Path(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
s = Spool(d)
s.append([("argus.steps", b"k", b"x" * 1000)])
seg = next(d.glob("*.seg"))
limit = seg.stat().st_size + 3000  # room for 3 of the next 4 records: a partial write
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
error = None
try:
    s.append([("argus.steps", b"k", b"y" * 1000)] * 4)
except OSError as exc:
    error = exc.strerror
counted_after_error = s.bytes
on_disk_after_error = sum(p.stat().st_size for p in d.glob("*.seg"))
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space came back
s.append([("argus.heartbeats", b"h", b"beat")])
print(json.dumps({
    "error": error,
    "counted_after_error": counted_after_error,
    "on_disk_after_error": on_disk_after_error,
    "counted": s.bytes,
    "on_disk": sum(p.stat().st_size for p in d.glob("*.seg")),
    "read": [[t, v.decode()[:4]] for t, _k, v in s.read(100)],
    "reopened": [[t, v.decode()[:4]] for t, _k, v in Spool(d).read(100)],
}))
"""


def test_a_full_disk_keeps_the_count_true_and_the_next_record(tmp_path: Path) -> None:
    """A write that fails half way (the file system refuses more bytes): the spool counts
    what is on disk (before: 1,023 counted where 4,096 were on disk) and a record written
    once space is back is read back (before: lost behind the torn tail). A real partial
    write, through RLIMIT_FSIZE in a child process."""
    out = subprocess.run(
        [sys.executable, "-c", _DISK_FULL, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=True,
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["error"]  # the file system refused the write
    assert r["counted_after_error"] == r["on_disk_after_error"]
    assert r["counted"] == r["on_disk"]
    want = [["argus.steps", "xxxx"], ["argus.heartbeats", "beat"]]
    assert r["read"] == want
    assert r["reopened"] == want


def test_a_prepend_after_a_partial_replay_keeps_the_replay_cursor(tmp_path: Path) -> None:
    """The publisher reads k0, k1 from the spool, librdkafka takes only k0, k1 is
    re-prepended: the next reads give k1..k4 (before: [k1, k0, k1, k2, k3, k4])."""
    s = Spool(tmp_path)
    s.append(recs(0, 5))
    first = s.read(2)
    assert first == recs(0, 2)
    s.prepend(first[1:])
    assert s.read(100) == recs(1, 5)
    s.commit()
    assert s.bytes == on_disk(tmp_path) == 0 and len(s) == 0


def test_spool_files_are_private(tmp_path: Path) -> None:
    d = tmp_path / "home" / "spool"
    s = Spool(d)
    s.append(recs(0, 1))
    s.prepend(recs(1, 2))
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    for p in d.glob("*.seg"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600


def test_a_replay_that_stops_just_before_a_torn_tail_still_finishes_the_segment(tmp_path: Path) -> None:
    """Reading exactly the intact records of a torn segment ends it, so that commit deletes
    it (before: it stayed on disk and replayed again in the next process)."""
    s = Spool(tmp_path)
    s.append(recs(0, 3))
    seg = next(tmp_path.glob("*.seg"))
    seg.write_bytes(seg.read_bytes() + b"\x00\x00\x00\x30\x00")
    again = Spool(tmp_path)
    assert again.read(3) == recs(0, 3) and len(again) == 0
    again.commit()
    assert not list(tmp_path.glob("*.seg")) and again.bytes == 0
