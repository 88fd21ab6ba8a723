"""``argus grafana``: dashboards and alert rules as code."""

from __future__ import annotations

from pathlib import Path

import typer

from ..config import redact_url
from ._app import app, console, exit_on_error, fail, settings

grafana_app = typer.Typer(
    help="Grafana dashboards and alert rules: export files or push to Grafana.", no_args_is_help=True
)
app.add_typer(grafana_app, name="grafana")


@grafana_app.command("export")
def export_cmd(
    out: Path = typer.Option(Path("deploy/grafana"), help="folder for dashboards/ and provisioning/"),
    check: bool = typer.Option(False, help="only check that the files in --out are up to date"),
    base_url: str = typer.Option(
        "http://localhost:3000",
        help="absolute URL of the Grafana people open: every alert's dashboard link starts with it "
        "(written into the files: released Grafana does not expand variables in rule annotations)",
    ),
    docs_url: str = typer.Option(
        "https://github.com/argus-gpu/argus/blob/main/docs/on-call.md",
        help="where docs/on-call.md is read: every alert's runbook_url is an anchor in it",
    ),
    datasource_uid: str = typer.Option("argus-clickhouse", help="uid of the ClickHouse datasource"),
    integration: list[str] = typer.Option(
        ["webhook"],
        help="what the contact points send to, repeatable: webhook, slack, pagerduty, email "
        "(each reads its URL, key or address from Grafana's environment; see docs/on-call.md)",
    ),
    team_route: list[str] = typer.Option(
        [], help="TEAM=CONTACT_POINT, repeatable: pages of TEAM's jobs (named TEAM/...) go there"
    ),
) -> None:
    """Write the provisioning files (or check they match the code with --check)."""
    from argus.sinks.grafana import GrafanaOptions, export, rendered_files

    routes = []
    for spec in team_route:
        team, sep, receiver = spec.partition("=")
        if not sep or not team or not receiver:
            fail(f"--team-route {spec!r}: expected TEAM=CONTACT_POINT")
        routes.append((team, receiver))
    with exit_on_error(ValueError):  # GrafanaOptions' ValueError: the options given
        options = GrafanaOptions(
            datasource_uid=datasource_uid,
            base_url=base_url,
            docs_url=docs_url,
            integrations=tuple(integration),
            team_routes=tuple(routes),
        )

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
    from argus.sinks.grafana import push

    s = settings()
    url = url or s.grafana_url
    if not url:
        fail("no Grafana URL: pass --url or set ARGUS_GRAFANA_URL")
    if not s.grafana_token:
        fail("no Grafana token: set ARGUS_GRAFANA_TOKEN or ARGUS_GRAFANA_TOKEN_FILE")
    with exit_on_error():
        result = push(url, s.grafana_token)
    console.print(
        f"pushed {len(result.dashboards)} dashboards and {len(result.rules)} alert rules to {redact_url(url)}"
    )
