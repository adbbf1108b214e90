"""One router per page: sign-in, overview, jobs, DLQ, cron, outbox, email log."""
