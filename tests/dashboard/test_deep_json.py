"""The dashboard's cron form with a payload nested deeper than the limit, or deeper than the
JSON parser can recurse through: a 400 naming the rule, not a 500 (it used to raise
RecursionError)."""

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
