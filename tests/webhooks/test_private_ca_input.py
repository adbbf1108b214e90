"""A private CA as input: what is refused (by name, nothing written), what is stored, what
`webhooks list` shows, and one TLS context per CA."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from sqlalchemy import text

from postrelay.core.errors import NotFoundError, ValidationError
from postrelay.relay.webhooks import webhook_add, webhook_list, webhook_set_ca
from postrelay.relay.webhooks.trust import MAX_CA_PEM_CHARS, CaContexts, validate_ca_pem
from tests.webhooks.test_endpoints import run

URL = "https://hooks.internal.example/in"


def pem(ca: trustme.CA) -> str:
    return ca.cert_pem.bytes().decode("ascii")


def stored_cas(engine) -> list[str | None]:
    with engine.connect() as conn:
        return list(conn.execute(text(
            "SELECT ca_pem FROM mdm.aa_webhook_endpoint ORDER BY created_at")).scalars())


def bad_pems(ca: trustme.CA) -> list[tuple[str, str]]:
    """(PEM, a word of the rule it breaks)."""
    leaf = ca.issue_cert("hooks.internal.example")
    leaf_pem = leaf.cert_chain_pems[0].bytes().decode("ascii")
    key_pem = leaf.private_key_pem.bytes().decode("ascii")
    good = pem(ca)
    return [
        ("", "at least one"),
        ("not a certificate\n", "at least one"),
        (good.replace("MII", "MIX", 1), "ssl can load"),
        ("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "ssl can load"),
        (leaf_pem, "not a CA"),
        (good + key_pem, "only CERTIFICATE blocks"),
        ("\u00e9" + good, "ASCII"),
        (good + " " * MAX_CA_PEM_CHARS, "at most"),
    ]


def test_a_bad_ca_is_refused_by_name_and_nothing_is_written(engine, wh_tenant, ca):
    with engine.begin() as conn:
        endpoint, _ = webhook_add(conn, wh_tenant, URL)
    for bad, rule in bad_pems(ca):
        with engine.begin() as conn:
            with pytest.raises(ValidationError, match=rule) as info:
                webhook_add(conn, wh_tenant, URL, ca_pem=bad)
            assert info.value.field == "ca_pem"
            with pytest.raises(ValidationError, match=rule) as info:
                webhook_set_ca(conn, endpoint.id, bad)
            assert info.value.field == "ca_pem"
    # A CA for an http:// endpoint would protect nothing.
    with engine.begin() as conn:
        with pytest.raises(ValidationError, match="https:// endpoints only") as info:
            webhook_add(conn, wh_tenant, "http://hooks.internal.example/", ca_pem=pem(ca))
        assert info.value.field == "ca_pem"
        plain, _ = webhook_add(conn, wh_tenant, "http://hooks.internal.example/")
        with pytest.raises(ValidationError, match="https:// endpoints only"):
            webhook_set_ca(conn, plain.id, pem(ca))
        with pytest.raises(NotFoundError):
            webhook_set_ca(conn, uuid.uuid4(), pem(ca))
        with pytest.raises(NotFoundError):
            webhook_set_ca(conn, endpoint.id, pem(ca), tenant_id=uuid.uuid4())
    assert stored_cas(engine) == [None, None]


def test_only_the_ca_certificates_are_stored_and_never_listed(engine, wh_tenant, ca):
    other = trustme.CA()
    given = f"subject=CN=internal\n{pem(ca)}\n# and the old one\n{pem(other)}"
    with engine.begin() as conn:
        endpoint, _ = webhook_add(conn, wh_tenant, URL, ca_pem=given)
        assert endpoint.private_ca
        listed = webhook_list(conn, tenant_id=wh_tenant)
    assert [e.private_ca for e in listed] == [True]
    assert "BEGIN" not in repr(listed[0]) and not hasattr(listed[0], "ca_pem")
    (stored,) = stored_cas(engine)
    assert stored is not None and "subject=" not in stored and "#" not in stored
    assert stored.count("-----BEGIN CERTIFICATE-----") == 2
    assert validate_ca_pem(stored) == stored  # stored as it loads: checking it again keeps it


def dated_ca(name: str, not_before: datetime, not_after: datetime) -> str:
    """A self-signed CA certificate (PEM) valid from `not_before` to `not_after`."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode("ascii")


NOW = datetime.now(UTC).replace(microsecond=0)
EXPIRED = dated_ca("Old Internal CA", NOW - timedelta(days=800), NOW - timedelta(days=2))
NOT_YET = dated_ca("Next Internal CA", NOW + timedelta(days=2), NOW + timedelta(days=800))


def test_a_ca_expired_or_not_yet_valid_is_refused_naming_its_dates(engine, wh_tenant, ca):
    # ssl loads both without a word; every delivery through them would fail verification.
    expired_on = (NOW - timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    valid_from = (NOW + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    cases = [(EXPIRED, f"'CN=Old Internal CA' expired on {expired_on} \\(notAfter\\)"),
             (NOT_YET, f"'CN=Next Internal CA' is not valid before {valid_from} "
                       "\\(notBefore\\)"),
             # One stale certificate in a bundle is refused too, not stored beside the good.
             (pem(ca) + EXPIRED, "'CN=Old Internal CA' expired")]
    with engine.begin() as conn:
        endpoint, _ = webhook_add(conn, wh_tenant, URL)
    for given, rule in cases:
        with pytest.raises(ValidationError, match=rule) as info:
            validate_ca_pem(given)
        assert info.value.field == "ca_pem"
        with engine.begin() as conn:
            with pytest.raises(ValidationError, match=rule):
                webhook_add(conn, wh_tenant, URL, ca_pem=given)
            with pytest.raises(ValidationError, match=rule):
                webhook_set_ca(conn, endpoint.id, given)
    assert stored_cas(engine) == [None]
    # Valid at the moment checked: the same certificates pass at a time inside their window.
    assert validate_ca_pem(EXPIRED, now=NOW - timedelta(days=3)).startswith("-----BEGIN")
    assert validate_ca_pem(NOT_YET, now=NOW + timedelta(days=3)).startswith("-----BEGIN")


def test_one_context_per_ca_the_least_used_dropped(ca):
    contexts = CaContexts(size=2)
    first, second, third = pem(ca), pem(trustme.CA()), pem(trustme.CA())
    built = contexts.get(first)
    assert contexts.get(first) is built  # not rebuilt for the next delivery
    assert built.check_hostname and built.cert_store_stats()["x509_ca"] == 1
    contexts.get(second)
    contexts.get(first)  # used: `second` is now the least recently used
    contexts.get(third)
    assert contexts.get(first) is built
    assert set(contexts._contexts) == {first, third}


def test_cli_add_with_ca_file_list_set_ca_and_clear(worker_env, engine, wh_tenant, ca, ca_file,
                                                    tmp_path):
    env = {**worker_env, "POSTRELAY_WEBHOOK_ALLOW_PRIVATE": "true"}
    added = run(env, "webhooks", "add", "--tenant", str(wh_tenant), URL, "--ca-file",
                str(ca_file), "--json")
    assert added.returncode == 0, added.stderr
    endpoint_id = json.loads(added.stdout)["endpoint"]["id"]
    listed = run(env, "webhooks", "list", "--json")
    assert [e["private_ca"] for e in json.loads(listed.stdout)] == [True]
    table = run(env, "webhooks", "list").stdout
    assert "CA" in table.splitlines()[0] and "private" in table
    assert "BEGIN" not in listed.stdout + table

    cleared = run(env, "webhooks", "set-ca", endpoint_id, "--clear")
    assert cleared.returncode == 0, cleared.stderr
    assert "default" in run(env, "webhooks", "list").stdout
    assert stored_cas(engine) == [None]
    again = run(env, "webhooks", "set-ca", endpoint_id, "--ca-file", str(ca_file))
    assert again.returncode == 0, again.stderr
    assert stored_cas(engine) == [pem(ca)]


def test_cli_refuses_a_bad_ca_file_naming_it(worker_env, engine, wh_tenant, ca, tmp_path):
    env = {**worker_env, "POSTRELAY_WEBHOOK_ALLOW_PRIVATE": "true"}
    leaf = ca.issue_cert("hooks.internal.example")
    # Each rule is tested on the function above; here, that the CLI names its option.
    files = {"leaf.pem": (leaf.cert_chain_pems[0].bytes(), "not a CA"),
             "expired.pem": (EXPIRED.encode("ascii"), "'CN=Old Internal CA' expired on"),
             "ca.der": (b"\x30\x82\x01\xff" + bytes(range(128, 256)), "ASCII")}
    for name, (content, rule) in files.items():
        (tmp_path / name).write_bytes(content)
        refused = run(env, "webhooks", "add", "--tenant", str(wh_tenant), URL,
                      "--ca-file", str(tmp_path / name))
        assert refused.returncode == 1 and "--ca-file:" in refused.stderr, refused.stderr
        assert rule in refused.stderr, refused.stderr
    missing = run(env, "webhooks", "add", "--tenant", str(wh_tenant), URL,
                  "--ca-file", str(tmp_path / "missing.pem"))
    assert missing.returncode == 1 and "--ca-file: cannot read" in missing.stderr
    http = run(env, "webhooks", "add", "--tenant", str(wh_tenant), "http://x.example/",
               "--ca-file", str(tmp_path / "leaf.pem"))
    assert http.returncode == 1 and "--ca-file: a private CA is for https://" in http.stderr
    assert stored_cas(engine) == []  # nothing written

    with engine.begin() as conn:
        endpoint, _ = webhook_add(conn, wh_tenant, URL)
    for args in ([], ["--ca-file", str(tmp_path / "leaf.pem")]):
        refused = run(env, "webhooks", "set-ca", str(endpoint.id), *args)
        assert refused.returncode == 1 and "--ca-file:" in refused.stderr, refused.stderr
    assert stored_cas(engine) == [None]
