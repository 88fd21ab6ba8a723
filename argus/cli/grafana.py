"""``argus grafana``: dashboards and alert rules as code."""

from __future__ import annotations

from pathlib import Path

import typer

from ..config import redact_url
from ._app import EXIT_UNAVAILABLE, app, console, fail, settings

grafana_app = typer.Typer(
    help="Grafana dashboards and alert rules: export files or push to Grafana.", no_args_is_help=True
)
app.add_typer(grafana_app, name="grafana")


@grafana_app.command("export")
def export_cmd(
    out: Path = typer.Option(Path("deploy/grafana"), help="folder for dashboards/ and provisioning/"),
    check: bool = typer.Option(False, help="only check that the files in --out are up to date"),
    runbook_base_url: str = typer.Option(
        "${ARGUS_GRAFANA_URL}",
        help="absolute Grafana URL prefixed to every alert's runbook_url (default: expanded by "
        "Grafana's provisioning from its ARGUS_GRAFANA_URL environment variable)",
    ),
    datasource_uid: str = typer.Option("argus-clickhouse", help="uid of the ClickHouse datasource"),
) -> None:
    """Write the provisioning files (or check they match the code with --check)."""
    from argus.sinks.grafana import GrafanaOptions, export, rendered_files

    options = GrafanaOptions(datasource_uid=datasource_uid, runbook_base_url=runbook_base_url)

    if check:
        stale = [
            rel
            for rel, text in rendered_files(options).items()
            if not (out / rel).is_file() or (out / rel).read_text() != text
        ]
        if stale:
            fail(f"out of date in {out}: {', '.join(stale)}; run `argus grafana export --out {out}`")
        console.print(f"{out}: up to date")
        return
    for path in export(out, options):
        console.print(f"wrote {path}")


@grafana_app.command("push")
def push_cmd(
    url: str = typer.Option("", help="Grafana URL (default ARGUS_GRAFANA_URL)"),
) -> None:
    """Create or update the Argus folder, dashboards and alert rules in a running Grafana.

    The service-account token comes from ARGUS_GRAFANA_TOKEN or the file named by
    ARGUS_GRAFANA_TOKEN_FILE, never from the command line (visible to every user in ps).
    """
    from argus.sinks.grafana import GrafanaPushError, push

    s = settings()
    url = url or s.grafana_url
    if not url:
        fail("no Grafana URL: pass --url or set ARGUS_GRAFANA_URL")
    if not s.grafana_token:
        fail("no Grafana token: set ARGUS_GRAFANA_TOKEN or ARGUS_GRAFANA_TOKEN_FILE")
    try:
        result = push(url, s.grafana_token)
    except GrafanaPushError as exc:
        fail(str(exc), EXIT_UNAVAILABLE)
    console.print(
        f"pushed {len(result.dashboards)} dashboards and {len(result.rules)} alert rules to {redact_url(url)}"
    )
