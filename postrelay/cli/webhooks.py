"""`postrelay webhooks add|list|set-ca|disable|enable|rm|attempts`: a tenant's webhook
endpoints."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from postrelay.cli.boundary import GuardedGroup
from postrelay.cli.common import settings_or_exit, transaction
from postrelay.cli.output import echo, print_json, table
from postrelay.cli.root import app
from postrelay.core.errors import ValidationError
from postrelay.relay import (
    webhook_add,
    webhook_attempts,
    webhook_disable,
    webhook_enable,
    webhook_list,
    webhook_remove,
    webhook_set_ca,
)

webhooks_app = typer.Typer(help="Webhook endpoints: outbox events POSTed, Standard Webhooks "
                                "signed.", no_args_is_help=True,
                           cls=GuardedGroup)
app.add_typer(webhooks_app, name="webhooks")

JSON_OPT = typer.Option(False, "--json", help="Print JSON instead of a table.")
CA_FILE_HELP = ("PEM file of the private CA that signed the endpoint's certificate; its "
                "deliveries trust it instead of the default CAs. Stored in the database.")
# A CA bundle is some kilobytes; the library refuses more than 64 KiB, this reads no further.
_CA_FILE_READ_LIMIT = 64 * 1024 + 1


@webhooks_app.command("add")
def webhooks_add(
    url: str = typer.Argument(..., help="http:// or https:// URL the events are POSTed to."),
    tenant: str = typer.Option(..., "--tenant", help="Owning tenant id."),
    event_types: list[str] = typer.Option(
        [], "--event-type", help="Only these event types; globs such as 'order.*' "
                                 "(repeatable; none: every type)."),
    ca_file: Path | None = typer.Option(None, "--ca-file", help=CA_FILE_HELP),
    as_json: bool = JSON_OPT,
) -> None:
    """Add an endpoint and print its signing secret (shown this once only).

    The URL is normalised and checked; loopback and private addresses need
    POSTRELAY_WEBHOOK_ALLOW_PRIVATE=true. An https:// receiver whose certificate comes from
    an internal CA needs --ca-file."""
    allow_private = settings_or_exit().webhook_allow_private
    with transaction() as conn, _named_ca_file():
        ca_pem = None if ca_file is None else _read_ca_file(ca_file)
        endpoint, secret = webhook_add(conn, tenant, url, event_types=event_types or None,
                                       allow_private=allow_private, ca_pem=ca_pem)
    if as_json:
        print_json({"endpoint": endpoint, "secret": secret})
        return
    echo(f"added webhook endpoint {endpoint.id} -> {endpoint.url}")
    echo(f"secret: {secret}")
    echo("Store the secret now: the receiver verifies signatures with it, and it is "
               "not shown again.")


@webhooks_app.command("list")
def webhooks_list(
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant's endpoints."),
    as_json: bool = JSON_OPT,
) -> None:
    """Every endpoint with its filter, state and CA (secrets and CAs are never listed).

    BY says who disabled an endpoint: operator (this CLI, the service-role key), tenant (a
    tenant's API key) or receiver (it answered 410 Gone)."""
    with transaction() as conn:
        endpoints = webhook_list(conn, tenant_id=tenant)
    if as_json:
        print_json(endpoints)
        return
    rows = [[e.id, e.tenant_id, e.url, ",".join(e.event_types or ["*"]),
             "private" if e.private_ca else "default", "enabled" if e.enabled else "disabled",
             e.disabled_by, e.disabled_reason] for e in endpoints]
    echo(table(["ID", "TENANT", "URL", "EVENT_TYPES", "CA", "STATE", "BY", "REASON"], rows)
               if rows else "no webhook endpoints")


@webhooks_app.command("set-ca")
def webhooks_set_ca(
    endpoint_id: str = typer.Argument(...),
    ca_file: Path | None = typer.Option(None, "--ca-file", help=CA_FILE_HELP),
    clear: bool = typer.Option(False, "--clear", help="Trust the default CAs again."),
) -> None:
    """Trust a private CA for an https:// endpoint, or the default CAs again (--clear).

    It applies from the endpoint's next delivery on."""
    with transaction() as conn, _named_ca_file():
        if (ca_file is None) == (not clear):
            raise ValidationError("--ca-file", "give either --ca-file PATH or --clear, one of them")
        ca_pem = None if ca_file is None else _read_ca_file(ca_file)
        webhook_set_ca(conn, endpoint_id, ca_pem)
    echo(f"{endpoint_id} trusts {'the default CAs' if clear else f'the CA in {ca_file}'}")


@contextmanager
def _named_ca_file() -> Iterator[None]:
    """The library names the CA `ca_pem`; here the user gave it as --ca-file."""
    try:
        yield
    except ValidationError as exc:
        if exc.field != "ca_pem":
            raise
        raise ValidationError("--ca-file", exc.rule) from None


def _read_ca_file(path: Path) -> str:
    try:
        with path.open("rb") as f:
            data = f.read(_CA_FILE_READ_LIMIT)
    except OSError as exc:
        raise ValidationError("--ca-file", f"cannot read {path}: {exc.strerror or exc}") \
            from None
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        raise ValidationError("--ca-file", f"{path} must be PEM text (ASCII); a DER file "
                                           "needs `openssl x509 -inform der` first") from None


@webhooks_app.command("disable")
def webhooks_disable(
    endpoint_id: str = typer.Argument(...),
    reason: str = typer.Option("disabled by an operator", "--reason"),
) -> None:
    """Stop delivering to an endpoint; its queued deliveries stop unsent.

    It is recorded as disabled by an operator: the tenant's API key cannot enable it
    again, only this command's `enable` or the service-role key."""
    with transaction() as conn:
        webhook_disable(conn, endpoint_id, reason=reason)
    echo(f"disabled {endpoint_id}")


@webhooks_app.command("enable")
def webhooks_enable(endpoint_id: str = typer.Argument(...)) -> None:
    """Deliver to an endpoint again (events from now on), whoever disabled it.

    `postrelay outbox replay --since ...` then sends what it missed while disabled."""
    with transaction() as conn:
        webhook_enable(conn, endpoint_id)
    echo(f"enabled {endpoint_id}")


@webhooks_app.command("rm")
def webhooks_rm(endpoint_id: str = typer.Argument(...)) -> None:
    """Delete an endpoint and its delivery log."""
    with transaction() as conn:
        webhook_remove(conn, endpoint_id)
    echo(f"deleted {endpoint_id}")


@webhooks_app.command("attempts")
def webhooks_attempts(
    endpoint: str | None = typer.Option(None, "--endpoint", help="Only this endpoint's."),
    event: str | None = typer.Option(None, "--event", help="Only this outbox event's."),
    limit: int = typer.Option(50, "--limit", help="At most this many (1-500)."),
    as_json: bool = JSON_OPT,
) -> None:
    """The delivery log, newest first: status, duration, response or error per attempt."""
    with transaction() as conn:
        attempts = webhook_attempts(conn, endpoint_id=endpoint, event_id=event, limit=limit)
    if as_json:
        print_json(attempts)
        return
    rows = [[a.created_at, a.endpoint_id, a.event_id, a.attempt, a.status_code,
             f"{a.duration_ms} ms", a.error or a.response_body] for a in attempts]
    echo(table(["AT", "ENDPOINT", "EVENT", "ATTEMPT", "STATUS", "DURATION", "DETAIL"],
                     rows) if rows else "no attempts")
