"""``argus grafana push`` with the real grafana-client over HTTP against a replayed Grafana exchange.

The exchange (tests/sinks/data/grafana_push_exchange.json) lists every request Grafana should
see, in order, and its response. The server below refuses anything else, and checks each
body the way Grafana would (see test_grafana_provisioning.py for the cited rules).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from argus.sinks.grafana import GrafanaPushError, push

EXCHANGE = json.loads((Path(__file__).parent / "data" / "grafana_push_exchange.json").read_text())
TOKEN = "glsa_test_token_not_a_secret"


def grafana_would_refuse(kind: str, body: dict[str, Any]) -> str | None:
    """The body checks Grafana's handlers make for each kind of request (None: accepted)."""
    if kind == "dashboard":
        dash = body.get("dashboard", {})
        if not re.fullmatch(r"[a-zA-Z0-9\-_]{1,40}", dash.get("uid", "")) or not dash.get("title"):
            return "invalid dashboard uid or title"
        if body.get("folderUid") != "argus" or body.get("overwrite") is not True:
            return "dashboard not put in the Argus folder"
    if kind == "alert_rule":
        annotations = body.get("annotations", {})
        if bool(annotations.get("__dashboardUid__")) != bool(annotations.get("__panelId__")):
            return "invalid alert rule: both annotations __dashboardUid__ and __panelId__ must be specified"
        if "keepFiringFor" in body or "keep_firing_for" not in body:  # the API ignores keepFiringFor
            return "keep_firing_for missing"
        if body.get("condition") not in [q.get("refId") for q in body.get("data", [])]:
            return "Condition does not exist"
        if not body.get("folderUID") or not body.get("ruleGroup"):
            return "folderUID and ruleGroup are required"
        if not str(annotations.get("runbook_url", "")).startswith("http"):
            return "runbook_url not absolute"
    if kind == "folder" and (body.get("uid"), body.get("title")) != ("argus", "Argus"):
        return "folder"
    return None


class Replay:
    """A Grafana stand-in that answers from a recorded exchange, strictly in order."""

    def __init__(self, exchange: list[dict[str, Any]]) -> None:
        self.exchange = list(exchange)
        self.seen: list[tuple[str, str, dict[str, Any]]] = []
        self.errors: list[str] = []
        replay = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(size)) if size else {}
                replay.seen.append((self.command, self.path, body))
                status, payload = replay.answer(self.command, self.path, self.headers, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def answer(self, method: str, path: str, headers: Any, body: dict[str, Any]) -> tuple[int, Any]:
        if headers.get("Authorization") != f"Bearer {TOKEN}":
            self.errors.append(f"{method} {path}: no bearer token")
            return 401, {"message": "Unauthorized"}
        if not self.exchange:
            self.errors.append(f"unexpected {method} {path}")
            return 500, {"message": "not in the exchange"}
        step = self.exchange.pop(0)
        want = step["request"]
        if (method, path) != (want["method"], want["path"]):
            self.errors.append(f"expected {want['method']} {want['path']}, got {method} {path}")
            return 500, {"message": "out of order"}
        if "check" in want and step["response"]["status"] < 400:
            refusal = grafana_would_refuse(want["check"], body)
            if refusal:
                self.errors.append(f"{method} {path}: {refusal}")
                return 400, {"message": refusal}
        return step["response"]["status"], step["response"]["body"]


@pytest.fixture
def grafana(request: pytest.FixtureRequest) -> Iterator[Replay]:
    replay = Replay(EXCHANGE[request.param])
    thread = threading.Thread(target=replay.server.serve_forever, daemon=True)
    thread.start()
    yield replay
    replay.server.shutdown()
    replay.server.server_close()


@pytest.mark.parametrize("grafana", ["fresh_grafana"], indirect=True)
def test_push_to_a_fresh_grafana_creates_folder_dashboards_and_rules(grafana: Replay) -> None:
    result = push(grafana.url, TOKEN)
    assert grafana.errors == [] and grafana.exchange == []  # every request expected, every one made
    assert result.dashboards == [
        "argus-job",
        "argus-rank",
        "argus-kernel",
        "argus-anomalies",
        "argus-fleet",
        "argus-pipeline",
    ]
    assert result.rules == ["argus-slow-rank", "argus-lost-rank", "argus-hang", "argus-node-suspect"]
    rules = [body for method, path, body in grafana.seen if path == "/api/v1/provisioning/alert-rules"]
    assert [r["keep_firing_for"] for r in rules] == ["5m", "1m", "1m", "1h"]
    assert all(r["annotations"]["dashboard_url"].count(grafana.url + "/d/") >= 1 for r in rules)
    assert all(r["annotations"]["runbook_url"].startswith("https://") for r in rules)
    assert [r["annotations"]["__dashboardUid__"] for r in rules] == ["argus-job"] * 3 + ["argus-fleet"]


@pytest.mark.parametrize("grafana", ["second_push"], indirect=True)
def test_a_second_push_updates_in_place(grafana: Replay) -> None:
    result = push(grafana.url, TOKEN)
    assert grafana.errors == [] and grafana.exchange == []
    assert [m for m, p, _ in grafana.seen if "alert-rules/" in p] == ["GET", "PUT"] * 4
    assert len(result.rules) == 4


@pytest.mark.parametrize("grafana", ["refused_dashboard"], indirect=True)
def test_a_refusal_names_the_step_and_grafanas_reason(grafana: Replay) -> None:
    with pytest.raises(GrafanaPushError, match=r"dashboard argus-job failed: .*uid too long") as err:
        push(grafana.url, TOKEN)
    assert TOKEN not in str(err.value)


def test_the_replay_refuses_what_grafana_refuses() -> None:
    body = {
        "annotations": {"__dashboardUid__": "argus-job"},
        "keepFiringFor": "5m",
        "condition": "C",
        "data": [],
    }
    assert "__panelId__ must be specified" in (grafana_would_refuse("alert_rule", body) or "")
    body["annotations"]["__panelId__"] = "6"
    assert grafana_would_refuse("alert_rule", body) == "keep_firing_for missing"
