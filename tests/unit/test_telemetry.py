import logging

from postrelay.core.telemetry import event


def test_fields_named_like_log_record_attributes_are_safe(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="postrelay"):
        event("postrelay.cron.fired", name="nightly", message="m", args=1, slot="x")
    (record,) = caplog.records
    assert record.event == "postrelay.cron.fired"
    assert record.fields == {"name": "nightly", "message": "m", "args": 1, "slot": "x"}
    assert "name=nightly" in record.getMessage()
