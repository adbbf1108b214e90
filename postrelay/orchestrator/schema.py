"""The email tables as SQLAlchemy metadata (created by migration 0007).

`aa_email_log` is the long-term record of every message attempt: one row per attempt,
written `sending` before the message is handed to the SMTP server and updated with the
outcome in the same transaction that completes the job. `job_id` is a foreign key with
ON DELETE SET NULL, so job retention keeps the log. `event_id` has no foreign key (outbox
retention deletes handled events), but joins the log to `aa_outbox_event` while the event
is kept. `aa_email_suppression` is the per-tenant list of addresses that do not exist.
"""

from sqlalchemy import (
    CheckConstraint,
    Column,
    ForeignKey,
    Index,
    Integer,
    PrimaryKeyConstraint,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

from postrelay.core.db import TIMESTAMPTZ, metadata

EMAIL_STATUSES = (
    "sending",  # committed before DATA; left behind only by a crash
    "sent",  # the server accepted the message for every recipient
    "partial",  # accepted for some recipients, refused for others (see recipient_results)
    "deferred",  # a transient failure (4xx, connection lost, timeout): the job retries
    "bounced",  # refused permanently (5xx): the job is dead-lettered
    "failed",  # could not be attempted (bad address, header injection, template error)
    "suppressed",  # every recipient is on the tenant's suppression list: nothing sent
    "unknown",  # a `sending` row found by a later attempt: the outcome was never learnt
    "cancelled",  # the job was cancelled before it ran: nothing sent (migration 0013)
)

email_log = Table(
    "aa_email_log",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True, server_default=text("gen_random_uuid()")),
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE"),
           nullable=False),
    Column("job_id", UUID(as_uuid=True), ForeignKey("mdm.aa_job.id", ondelete="SET NULL")),
    Column("event_id", UUID(as_uuid=True)),
    Column("template", Text, nullable=False),
    Column("template_version", Text),  # a hash of the template's files as rendered
    Column("category", Text),
    Column("from_address", Text, nullable=False),
    # Every envelope recipient (To, Cc and Bcc), lower-cased, for "what did we send to X".
    Column("recipients", ARRAY(Text), nullable=False),
    Column("to_addresses", ARRAY(Text), nullable=False),
    Column("cc_addresses", ARRAY(Text)),
    Column("bcc_addresses", ARRAY(Text)),
    Column("subject", Text),
    Column("message_id", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("smtp_code", Integer),
    Column("smtp_enhanced", Text),  # enhanced status code, e.g. 5.1.1
    Column("smtp_response", Text),
    Column("queue_id", Text),  # the server's id from its 250 reply to DATA, when it gives one
    # Per recipient: {"addr": {"status": "accepted|refused|suppressed", "code": 550, ...}}.
    Column("recipient_results", JSONB),
    Column("error", Text),
    Column("attempt", Integer, nullable=False),
    Column("created_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    Column("finished_at", TIMESTAMPTZ),
    CheckConstraint(
        "status IN (" + ", ".join(f"'{s}'" for s in EMAIL_STATUSES) + ")",
        name="email_log_status_chk",
    ),
    Index("ix_email_log_tenant_time", "tenant_id", "created_at"),
    Index("ix_email_log_recipients", "recipients", postgresql_using="gin"),
    Index("ix_email_log_status_time", "status", "created_at"),
    Index("ix_email_log_job", "job_id"),
    Index("ix_email_log_event", "event_id"),
    Index("ix_email_log_message_id", "message_id"),
)

email_suppression = Table(
    "aa_email_suppression",
    metadata,
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE"),
           nullable=False),
    Column("address", Text, nullable=False),  # lower-cased
    Column("reason", Text, nullable=False),
    Column("smtp_code", Integer),
    Column("smtp_enhanced", Text),
    Column("email_log_id", UUID(as_uuid=True)),  # the attempt that was refused
    Column("created_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("tenant_id", "address", name="aa_email_suppression_pkey"),
)
