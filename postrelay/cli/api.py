"""`postrelay api` serves the HTTP admin API; `postrelay keys` manages tenant-scoped keys."""

from __future__ import annotations

import socket

import typer

from postrelay.cli.boundary import GuardedGroup
from postrelay.cli.common import actor, check_listen, database, settings_or_exit, transaction
from postrelay.cli.output import echo, print_json, table
from postrelay.cli.root import app
from postrelay.core.errors import ConfigError
from postrelay.core.heap import freeze_startup_heap

keys_app = typer.Typer(help="API keys bound to one tenant (the service-role key is a setting).",
                       no_args_is_help=True,
                       cls=GuardedGroup)
app.add_typer(keys_app, name="keys")


@app.command("api")
def api_command(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port to listen on."),
) -> None:
    """Serve the HTTP admin API (needs POSTRELAY_SERVICE_ROLE_KEY)."""
    import uvicorn  # imported late: only this command needs it

    from postrelay.access import service_role_key
    from postrelay.web import create_web_app

    settings = settings_or_exit()
    try:
        # Checked before touching the database: refusing to start must be quick and clear.
        service_role_key(settings)
        _check_host(host, port)
        if port:  # 0: a free port the system picks
            check_listen(host, port, "--host", "--port")
    except ConfigError as exc:
        echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    with database(settings) as db:
        api = create_web_app(settings, db)
        # Client addresses (the sign-in throttle counts per address) come from the peer,
        # or from X-Forwarded-For when the peer is a proxy named in the setting.
        proxies = settings.api_forwarded_allow_ips
        freeze_startup_heap()  # core/heap.py: no full collection walks the app again
        uvicorn.run(api, host=host, port=port, log_level=settings.log_level.lower(),
                    proxy_headers=bool(proxies), forwarded_allow_ips=proxies or None)


def _check_host(host: str, port: int) -> None:
    """ConfigError naming --host when it names no address: uvicorn found it out only after
    the app had started, and said "[Errno -2] Name or service not known", exit 3. Empty:
    every interface, as asyncio reads it."""
    if not host:
        return
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else "not a host name"
        raise ConfigError(f"--host: cannot listen on {host!r}: {reason}") from None


@keys_app.command("add")
def keys_add(
    # Not "api:key:NAME": typer reads help as Rich markup, which prints :key: as an emoji.
    name: str = typer.Argument(..., help="Unique name; audit rows name the key by it, "
                                         "after 'api:key' and a colon."),
    tenant: str = typer.Option(..., "--tenant", help="The tenant id the key is bound to."),
) -> None:
    """Create a key bound to one tenant and print it. It is shown only this once."""
    from postrelay.access import api_key_create

    with transaction() as conn:
        view, key = api_key_create(conn, name, tenant_id=tenant, actor=actor())
    echo(key)
    echo(f"created key {view.name} for tenant {view.tenant_id}; store it now, it is "
               "not shown again", err=True)


@keys_app.command("list")
def keys_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Every key (never the key itself), revoked ones too, with who made and revoked it."""
    from postrelay.access import api_key_list

    with transaction() as conn:
        keys = api_key_list(conn)
    if as_json:
        print_json(keys)
        return
    rows = [[k.name, k.tenant_id, k.created_at, k.created_by or "(not recorded)",
             k.revoked_at, k.revoked_by] for k in keys]
    echo(table(["NAME", "TENANT", "CREATED_AT", "CREATED_BY", "REVOKED_AT", "REVOKED_BY"],
               rows) if rows else "no keys")


@keys_app.command("revoke")
def keys_revoke(name: str = typer.Argument(..., help="The key's name.")) -> None:
    """Revoke a key: it stops working at once."""
    from postrelay.access import api_key_revoke

    with transaction() as conn:
        api_key_revoke(conn, name, actor=actor())
    echo(f"revoked {name}")
