"""Operator commands: status, jobs, dlq (filled in by the admin module)."""
