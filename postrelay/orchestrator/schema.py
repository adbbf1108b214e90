"""The email tables as SQLAlchemy metadata (created by migration 0007).

`aa_email_log` is the long-term record of every message attempt: one row per attempt,
inserted with its outcome in the same transaction that completes the job. Nothing else is
written before the message goes out: the job's claim is the record that it may have
(orchestrator/attempts.py; until migration 0020 a mark in `aa_email_sending`), and an
attempt whose worker died becomes an `unknown` log row. The log has no foreign keys (each
would lock a tenant's or a job's row per message written): `job_id` and `event_id` join it
to jobs and events while those are kept, and the log outlives both.
`aa_email_suppression` is the per-tenant list of addresses not to send to: those that do
not exist (category ''), and those that unsubscribed from one category.
`aa_email_feedback` (migration 0012) keeps what arrived after the SMTP handoff: bounces,
complaints, delivery reports and unsubscribes, matched to the log row or kept unmatched.
"""

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

from postrelay.core.db import TIMESTAMPTZ, metadata

EMAIL_STATUSES = (
    "sending",  # before 0017: committed before DATA (the job's claim records it now)
    "sent",  # the server accepted the message for every recipient
    "partial",  # accepted for some recipients, refused for others (see recipient_results)
    "deferred",  # a transient failure (4xx, connection lost, timeout): the job retries
    "bounced",  # refused permanently (5xx): the job is dead-lettered
    "failed",  # could not be attempted (bad address, header injection, template error)
    "suppressed",  # every recipient is on the tenant's suppression list: nothing sent
    "unknown",  # its worker died or it was stopped at the server: the outcome was never learnt
    "cancelled",  # the job was cancelled before it ran: nothing sent (migration 0013)
)

# What feedback can say (aa_email_feedback.kind).
FEEDBACK_KINDS = (
    "delivered",  # a delivery report (DSN Action: delivered, a provider's Delivery event)
    "delayed",  # still trying (DSN Action: delayed, a provider's deferral)
    "soft-bounced",  # gave up after a transient failure (4.x.x, mailbox full)
    "bounced",  # refused permanently (5.x.x)
    "complaint",  # the recipient reported it as spam (ARF, a provider's complaint)
    "unsubscribe",  # one-click, mailto: or a provider's unsubscribe
    "auto-reply",  # out of office and the like (RFC 3834): recorded, otherwise ignored
    "unparsed",  # mail to the bounce domain that no parser understood: kept for an operator
)
# aa_email_log.delivery: what feedback said after the SMTP server accepted the message.
# A later report of a higher rank replaces a lower one, never the reverse (a delay report
# that arrives after the bounce does not undo it).
DELIVERY_OUTCOMES = ("delayed", "delivered", "soft-bounced", "bounced", "complained")

email_log = Table(
    "aa_email_log",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True,
           server_default=text("mdm.uuid_v7()")),  # time-ordered: core/ids.py
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    Column("job_id", UUID(as_uuid=True)),
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
    Column("delivery", Text),  # one of DELIVERY_OUTCOMES, from feedback; NULL: none yet
    Column("delivery_at", TIMESTAMPTZ),
    CheckConstraint(
        "status IN (" + ", ".join(f"'{s}'" for s in EMAIL_STATUSES) + ")",
        name="email_log_status_chk",
    ),
    CheckConstraint(
        "delivery IS NULL OR delivery IN ("
        + ", ".join(f"'{s}'" for s in DELIVERY_OUTCOMES) + ")",
        name="email_log_delivery_chk",
    ),
    Index("ix_email_log_tenant_time", "tenant_id", "created_at"),
    Index("ix_email_log_recipients", "recipients", postgresql_using="gin"),
    Index("ix_email_log_status_time", "status", "created_at"),
    Index("ix_email_log_job", "job_id"),
    Index("ix_email_log_event", "event_id"),
    # A Message-ID is `<job id@domain>` (message.py): ix_email_log_job finds it.
    Index("ix_email_log_queue_id", "queue_id"),
    Index("ix_email_log_delivery_time", "delivery", "created_at",
          postgresql_where=text("delivery IS NOT NULL")),
)

# Log rows per closed hour, tenant and status (orchestrator/email_hours.py): the bounce and
# complaint rates' denominators sum these instead of counting a week of the log.
email_hour = Table(
    "aa_email_hour",
    metadata,
    Column("hour", TIMESTAMPTZ, primary_key=True),
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE"),
           primary_key=True),
    Column("status", Text, primary_key=True),
    Column("messages", BigInteger, nullable=False),
)

# The tally's mark, one row: every hour before `until` is in aa_email_hour, and a round
# locks the row, so two leaders never tally the same hours at once.
email_hour_rollup = Table(
    "aa_email_hour_rollup",
    metadata,
    Column("id", Boolean, primary_key=True, server_default=text("true")),
    Column("until", TIMESTAMPTZ),
    CheckConstraint("id", name="email_hour_rollup_one_row_chk"),
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
    # '': every category (the address does not exist, or complained); else only this one.
    Column("category", Text, nullable=False, server_default=text("''")),
    Column("source", Text),  # smtp (the reply at send time), mail, ses, postmark, ...
    Column("feedback_id", UUID(as_uuid=True)),  # the feedback that suppressed it
    PrimaryKeyConstraint("tenant_id", "address", "category", name="aa_email_suppression_pkey"),
    # A feedback report's readers ask whether it suppressed (migration 0024).
    Index("ix_email_suppression_feedback", "feedback_id",
          postgresql_where=text("feedback_id IS NOT NULL")),
)

email_feedback = Table(
    "aa_email_feedback",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True, server_default=text("gen_random_uuid()")),
    # NULL while unmatched: nothing tells which tenant the feedback is about.
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE")),
    # No foreign key, as aa_email_suppression.email_log_id: log retention is the log's own.
    Column("email_log_id", UUID(as_uuid=True)),
    # verp, message_id, queue_id; token (a signed unsubscribe link); NULL: unmatched
    Column("matched_by", Text),
    Column("recipient", Text),  # lower-cased; NULL when the report withholds it
    Column("kind", Text, nullable=False),
    Column("status", Text),  # the enhanced status code, e.g. 5.1.1
    Column("diagnostic", Text),
    Column("source", Text, nullable=False),
    Column("source_event_id", Text),  # the source's own id: a DSN's Message-ID, an SNS id
    # The same feedback twice (a provider's retry, a DSN sent again) has the same key.
    Column("dedupe_key", Text, nullable=False),
    # Whether this report suppressed its address: while the suppression stands, its row
    # names the report (aa_email_suppression.feedback_id) and this stays false; lifting it
    # sets this, so the history stays. Read so by email_feedback_list (feedback.sql), the
    # email story (email.sql) and the demo's feedback rows (demo.sql).
    Column("suppressed", Boolean, nullable=False, server_default=text("false")),
    Column("detail", JSONB),  # what else the source said (Action, Feedback-Type, headers)
    Column("occurred_at", TIMESTAMPTZ),  # when the source says it happened
    Column("received_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    # Whether the report names a message postrelay sent to its recipient (migration 0026),
    # as it was when recorded: only those count toward the soft-bounce limit, also once log
    # retention has deleted the message's row. NULL before 0026 but for soft bounces.
    Column("sent_to", Boolean),
    CheckConstraint(
        "kind IN (" + ", ".join(f"'{s}'" for s in FEEDBACK_KINDS) + ")",
        name="email_feedback_kind_chk",
    ),
    UniqueConstraint("dedupe_key", name="email_feedback_dedupe_uk"),
    Index("ix_email_feedback_time", "received_at"),
    Index("ix_email_feedback_tenant_time", "tenant_id", "received_at"),
    Index("ix_email_feedback_log", "email_log_id"),
    Index("ix_email_feedback_recipient", "tenant_id", "recipient", "kind", "received_at"),
)

# Mail `postrelay inbound` accepted and has not recorded yet (migration 0022): the 250 is
# answered once a row is committed here; feedback/inbox.py records and deletes it. No
# tenant column: a raw message's tenant is unknown until it is matched. A message of up to
# about 8 kB stays in its row uncompressed (migration 0023): it lives for milliseconds.
feedback_inbox = Table(
    "aa_feedback_inbox",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True,
           server_default=text("mdm.uuid_v7()")),  # time-ordered: oldest first by the pkey
    Column("received_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    Column("envelope_to", ARRAY(Text), nullable=False),  # the RCPT TO addresses
    Column("raw", LargeBinary, nullable=False),
    Column("attempts", Integer, nullable=False, server_default=text("0")),  # failed ones
    Column("last_error", Text),
    Column("available_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    postgresql_with={"toast_tuple_target": 8160},
)

# Every lifted suppression (migration 0014): what was lifted, by whom. Grows with operator
# actions, not traffic.
email_suppression_audit = Table(
    "aa_email_suppression_audit",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE"),
           nullable=False),
    Column("address", Text, nullable=False),
    Column("action", Text, nullable=False),  # unsuppress
    Column("actor", Text, nullable=False),  # cli:<user>@<host>, ...
    Column("detail", JSONB, nullable=False),  # the rows lifted: category, reason, source
    Column("created_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    CheckConstraint("action IN ('unsuppress')", name="email_suppression_audit_action_chk"),
    Index("ix_email_suppression_audit_address", "tenant_id", "address", "created_at"),
    Index("ix_email_suppression_audit_time", "created_at"),  # retention (migration 0018)
)

