"""postrelay: a transactional outbox relay and email orchestrator on a PostgreSQL job queue."""

__version__ = "0.1.0"
