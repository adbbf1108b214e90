""""What was sent": the message rendered again from its job's payload with the email
templates (postrelay.orchestrator.templates), as the worker renders it, or — when the job
is gone or the template cannot be rendered — the context it was rendered with.

The HTML part is never put into the dashboard's own pages: /emails/{id}/preview serves it
on its own, framed by the story page in a sandbox (no scripts, no same-origin access, no
remote images), so a message's HTML can be looked at without being trusted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from postrelay.core.errors import PostrelayError
from postrelay.dashboard.web import pretty_json
from postrelay.orchestrator import Templates, event_context

# The preview frame's own policy: inline styles (emails need them), images only inline,
# nothing else; `sandbox` without allow-scripts keeps any script in the HTML from running.
PREVIEW_CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; sandbox; "
               "frame-ancestors 'self'")


@dataclass(frozen=True, slots=True)
class Preview:
    subject: str | None
    template: str
    context: str | None  # pretty JSON, or None when the job is gone (retention)
    text: str | None = None
    html: str | None = None
    note: str | None = None  # why the rendering differs or is missing


def of(templates: Templates, log: dict[str, Any], job: dict[str, Any] | None,
       tenant_name: str, event: dict[str, Any] | None = None) -> Preview:
    """`event`: the message's outbox event, with its payload, None once it is gone."""
    payload = job.get("payload") if job else None
    if not isinstance(payload, dict):
        return Preview(log.get("subject"), log["template"], None,
                       note="The job is gone (job retention), and with it the context the "
                            "template was rendered with.")
    context = payload.get("context")
    if payload.get("context_from_event") is True:  # a split route's message: its event's
        if event is None or not isinstance(event.get("payload"), dict):
            return Preview(log.get("subject"), log["template"], None,
                           note="The event is gone (outbox retention), and with it the "
                                "context the template was rendered with.")
        context = event_context(event["payload"], event_id=event["id"],
                                event_type=event["event_type"], tenant_id=log["tenant_id"],
                                aggregate_type=event["aggregate_type"],
                                aggregate_id=event["aggregate_id"],
                                created_at=event["created_at"])
    if not isinstance(context, dict):
        context = {}
    shown = pretty_json(context)
    try:
        rendered = templates.render(log["template"], context,
                                    tenant_keys=(tenant_name, str(log["tenant_id"])))
    except (PostrelayError, OSError) as exc:
        return Preview(log.get("subject"), log["template"], shown,
                       note=f"Not rendered again: {exc}")
    note = None
    if log.get("template_version") and log["template_version"] != rendered.version:
        note = (f"Rendered now with template version {rendered.version}; the message was "
                f"sent with version {log['template_version']}.")
    return Preview(rendered.subject, log["template"], shown, rendered.text, rendered.html,
                   note)
