"""The dashboard's cron form with a payload the JSON parser gives up on: nested deeper than
the limit or than the parser can recurse through (it used to raise RecursionError), or
holding an integer longer than Python converts (ValueError): a 400 naming the rule, not a
500."""

from __future__ import annotations

from tests.dashboard.conftest import csrf_of


def test_a_deep_cron_payload_is_a_400(admin, tenant):
    token = csrf_of(admin, "/dashboard/cron")
    for levels in (65, 5000):
        form = {"name": f"deep-{levels}", "schedule": "0 3 * * *", "kind": "reindex",
                "payload": '{"a": ' * levels + "1" + "}" * levels, "tenant": str(tenant),
                "csrf": token}
        page = admin.post("/dashboard/cron", data=form)
        assert page.status_code == 400, (levels, page.status_code)
        assert "more than 64 levels deep" in page.text, levels


def test_a_cron_payload_with_an_endless_integer_is_a_400(admin, tenant):
    token = csrf_of(admin, "/dashboard/cron")
    form = {"name": "long", "schedule": "0 3 * * *", "kind": "reindex", "tenant": str(tenant),
            "payload": '{"a": ' + "9" * 5000 + "}", "csrf": token}
    page = admin.post("/dashboard/cron", data=form)
    assert page.status_code == 400, page.text[:300]
    assert "payload: must not hold an integer of more than 4,300 digits" in page.text
    assert 'data-cron="long"' not in admin.get("/dashboard/cron").text
