"""One error root with few leaves. Validation errors name the field and the rule."""


class PostrelayError(Exception):
    """Root of every error postrelay raises on purpose."""


class ValidationError(PostrelayError, ValueError):
    """Input broke a rule; nothing was written."""

    def __init__(self, field: str, rule: str) -> None:
        self.field = field
        self.rule = rule
        super().__init__(f"{field}: {rule}")


class PayloadTooLargeError(ValidationError):
    """A document is over the size limit (POSTRELAY_MAX_PAYLOAD_BYTES); the HTTP API answers
    413."""


class NotFoundError(PostrelayError, LookupError):
    """The named thing does not exist (or is not in the state the operation needs)."""


class ConfigError(PostrelayError):
    """A setting is missing or wrong; the process must not start."""


class ConflictError(PostrelayError):
    """The write collides with existing state (e.g. a cron name already taken)."""


class ForbiddenError(PostrelayError):
    """The caller may not do this, whatever the input's shape: a kind or a cron name the
    system keeps for itself. `code` names the rule (`kind_reserved`, `name_reserved`)."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(message)
