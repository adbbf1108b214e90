"""Odd input to `outbox replay`, `webhooks` and `cron rm`: a one-line error naming the
field and the rule, exit 1, nothing written."""

from __future__ import annotations

import pytest

from tests.integration.test_cli_admin import run
from tests.integration.test_cli_errors import one_line_error


@pytest.mark.parametrize("args", [
    ("--since", "2024-01-02", "--until", "2024-01-01"),
    ("--since", "2024-01-01T10:00:00", "--until", "2024-01-01T10:00:00"),
    # The same instant, written in two zones.
    ("--since", "2024-01-01T10:00:00+05:00", "--until", "2024-01-01T05:00:00+00:00"),
])
def test_outbox_replay_refuses_an_empty_range(worker_env, clean_db, args):
    """`--since` at or after `--until` matched nothing and printed "replayed 0", as if
    the range had been right and simply had no events."""
    line = one_line_error(run(worker_env, "outbox", "replay", *args, ok=False))
    assert line == "error: --until: must be after since"


def test_outbox_replay_refuses_an_event_with_a_range(worker_env, clean_db):
    line = one_line_error(run(worker_env, "outbox", "replay", "--event",
                              "00000000-0000-0000-0000-000000000001", "--since", "2024-01-01",
                              ok=False))
    assert line == "error: --event: give an event id or a time range, not both"


@pytest.mark.parametrize(("args", "field"), [
    (("webhooks", "disable", "00000000-0000-0000-0000-000000000001", "--reason", "x\udcff"),
     "--reason"),
    (("webhooks", "add", "https://example.com/in", "--tenant",
      "00000000-0000-0000-0000-000000000001", "--event-type", "order.\udcff"), "--event-type"),
])
def test_webhook_text_that_is_not_utf8_names_the_option(worker_env, clean_db, args, field):
    """A byte that is not UTF-8 on the command line (read as \\udcff) was "unexpected
    UnicodeEncodeError", naming neither the option nor the rule."""
    line = one_line_error(run(worker_env, *args, ok=False))
    assert line.startswith(f"error: {field}: ") and "surrogate" in line


def test_cron_rm_of_a_name_that_is_not_utf8_names_the_argument(worker_env, clean_db):
    line = one_line_error(run(worker_env, "cron", "rm", "night\udcffly", ok=False))
    assert line.startswith("error: NAME: ") and "surrogate" in line
