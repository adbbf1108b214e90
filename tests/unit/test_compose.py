"""docker-compose.yml is valid, complete and runs the commands the README documents (there
is no Docker engine here to run it, so the file itself is checked)."""

import re
import shlex
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
README = (ROOT / "README.md").read_text()
POSTRELAY_SERVICES = {"migrate", "relay", "worker", "api", "inbound"}


def test_every_part_of_the_system_is_a_service():
    services = COMPOSE["services"]
    assert set(services) == {"postgres", "mailpit", *POSTRELAY_SERVICES}
    for name in POSTRELAY_SERVICES:
        assert services[name]["build"] == "." and services[name]["image"] == "postrelay:local"
        env = services[name]["environment"]
        assert env["POSTRELAY_DATABASE_URL"].startswith("postgresql://postrelay:")
        assert env["POSTRELAY_SMTP_HOST"] == "mailpit"


def test_long_running_services_have_health_checks_and_start_in_order():
    services = COMPOSE["services"]
    for name in ("postgres", "mailpit", "relay", "worker", "api", "inbound"):
        assert services[name]["healthcheck"]["test"], name
    for name, service in services.items():
        for dependency, rule in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            assert rule["condition"] in {"service_healthy", "service_completed_successfully",
                                         "service_started"}
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("relay", "worker", "api", "inbound"):
        migrate = services[name]["depends_on"]["migrate"]
        assert migrate["condition"] == "service_completed_successfully"
    # The worker's health check reads the metrics port it is told to serve.
    worker = services["worker"]
    assert worker["environment"]["POSTRELAY_WORKER_METRICS_PORT"] in " ".join(
        worker["healthcheck"]["test"])


def test_the_api_service_has_a_key_the_api_accepts():
    from postrelay.access.keys import service_role_key
    from postrelay.core.settings import Settings

    key = COMPOSE["services"]["api"]["environment"]["POSTRELAY_SERVICE_ROLE_KEY"]
    service_role_key(Settings(service_role_key=key))  # 32 characters at least


def test_services_run_the_commands_the_readme_documents():
    documented = set(re.findall(r"`(postrelay [^`]+)`", README))
    for name in POSTRELAY_SERVICES:
        command = "postrelay " + shlex.join(COMPOSE["services"][name]["command"])
        assert command in documented, f"{name}: {command!r} is not in the README"


def test_the_demo_app_the_services_name_registers_the_email_routes():
    from postrelay.demo.emails import demo_routes
    from postrelay.relay import RouteRegistry

    routes = demo_routes(RouteRegistry())
    assert {r.name for et in ("user.signed_up", "invoice.issued", "digest.due")
            for r in routes.matching(et)} == {"email:welcome", "email:invoice",
                                               "email:weekly_digest"}


def test_the_inbound_service_receives_for_the_bounce_domain_the_workers_sign_for():
    from postrelay.core.settings import Settings
    from postrelay.orchestrator import ReturnPath

    services = COMPOSE["services"]
    inbound, worker = services["inbound"]["environment"], services["worker"]["environment"]
    for name in ("POSTRELAY_EMAIL_BOUNCE_DOMAIN", "POSTRELAY_FEEDBACK_SECRET"):
        assert inbound[name] == worker[name], name
    assert ReturnPath.from_settings(Settings(
        email_bounce_domain=inbound["POSTRELAY_EMAIL_BOUNCE_DOMAIN"],
        feedback_secret=inbound["POSTRELAY_FEEDBACK_SECRET"])) is not None
    port = inbound["POSTRELAY_INBOUND_PORT"]
    assert f"{port}:{port}" in services["inbound"]["ports"]
    assert port in " ".join(services["inbound"]["healthcheck"]["test"])

