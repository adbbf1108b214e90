"""The DLQ's actions on rows that change between the confirmation and the click: the
action applies to the jobs the confirmation counted, and says what became of them."""

from __future__ import annotations

from sqlalchemy import text

from tests.dashboard.conftest import csrf_of, dead, form_fields
from tests.factories import audit_rows, job_row


def test_all_matching_applies_to_the_jobs_confirmed_not_to_those_dead_since(
        admin, engine, tenant):
    shown = [dead(engine, tenant, kind="reindex", ago=a) for a in (30, 20)]
    token = csrf_of(admin, "/dashboard/dlq")
    confirm = admin.post("/dashboard/dlq/confirm", data={
        "csrf": token, "action": "discard", "scope": "matching", "kind": "reindex"})
    assert "Discard 2 jobs matching this filter?" in confirm.text
    later = dead(engine, tenant, kind="reindex", ago=0)  # dead-lettered after the count
    done = admin.post("/dashboard/dlq/apply",
                      data=form_fields(confirm.text, "/dlq/apply"))  # the Discard button
    assert done.status_code == 303
    assert "2 jobs discarded." in admin.get(done.headers["location"]).text
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_job WHERE id = ANY(:ids)"),
                            {"ids": shown}).scalar() == 0
        assert job_row(conn, later)["state"] == "dlq" and audit_rows(conn, later) == []


def test_a_job_that_left_the_dlq_after_the_confirmation_is_counted_as_skipped(
        admin, engine, tenant):
    jobs = [dead(engine, tenant, ago=a) for a in (30, 20)]
    token = csrf_of(admin, "/dashboard/dlq")
    confirm = admin.post("/dashboard/dlq/confirm", data={
        "csrf": token, "action": "retry", "scope": "matching"})
    assert "Retry 2 jobs matching this filter?" in confirm.text
    fields = form_fields(confirm.text, "/dlq/apply")
    first = admin.post("/dashboard/dlq/apply", data=fields)
    assert "2 jobs retried." in admin.get(first.headers["location"]).text
    again = admin.post("/dashboard/dlq/apply", data=fields)  # the button clicked twice
    assert "0 jobs retried; 2 had already left the DLQ." in admin.get(
        again.headers["location"]).text
    with engine.connect() as conn:
        assert [len(audit_rows(conn, j)) for j in jobs] == [1, 1]


def test_confirming_jobs_that_all_left_the_dlq_says_so(admin, engine, tenant):
    job = dead(engine, tenant, kind="reindex")
    token = csrf_of(admin, "/dashboard/dlq")
    with engine.begin() as conn:  # retried elsewhere while the page was open
        conn.execute(text("UPDATE mdm.aa_job SET status = 'pending' WHERE id = :id"),
                     {"id": job})
    for form, said in (({"ids": str(job)}, "The jobs checked are no longer in the dead-letter"
                        " queue."),
                       ({"scope": "matching", "kind": "reindex"},
                        "No dead job matches this filter."),
                       # Retry… clicked with nothing checked (the script that disables
                       # the button until something is has not run).
                       ({}, "No job was checked")):
        gone = admin.post("/dashboard/dlq/confirm",
                          data={"csrf": token, "action": "retry", **form})
        assert gone.status_code == 303
        assert said in admin.get(gone.headers["location"]).text


def test_a_job_dead_lettered_again_after_the_confirmation_is_left_alone(admin, engine, tenant):
    # The confirmation showed the job's death at 30 s ago; meanwhile it was retried (the API,
    # the CLI, another browser), ran and died again with another error. The page the
    # operator read never showed that death: the click must not discard (or retry) it.
    jobs = [dead(engine, tenant, ago=a, last_error="first death") for a in (30, 20)]
    token = csrf_of(admin, "/dashboard/dlq")
    for scope in ({"ids": [str(j) for j in jobs]}, {"scope": "matching"}):
        confirm = admin.post("/dashboard/dlq/confirm",
                             data={"csrf": token, "action": "discard", **scope})
        assert "Discard 2 jobs" in confirm.text
        with engine.begin() as conn:
            conn.execute(text("UPDATE mdm.aa_job SET completed_at = now(), attempts = "
                              "attempts + 1, last_error = 'second death' WHERE id = :id"),
                         {"id": jobs[0]})
        done = admin.post("/dashboard/dlq/apply", data=form_fields(confirm.text, "/dlq/apply"))
        assert done.status_code == 303
        said = admin.get(done.headers["location"]).text
        assert "1 job discarded; 1 was dead-lettered again since, left alone." in said, said
        with engine.connect() as conn:
            assert job_row(conn, jobs[0])["state"] == "dlq"
            assert [a for a in audit_rows(conn, jobs[0]) if a["action"] == "job_discard"] == []
        jobs[1] = dead(engine, tenant, ago=10, last_error="first death")  # for the next round
