"""A tenant key's limit writes against the operator's, on a real PostgreSQL: the API checks
the operator's limits first (access.check_limit_change) and then writes, in one transaction
but several statements, so the write itself must judge the rows as it finds them."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from postrelay.core.errors import ForbiddenError
from postrelay.queue import limit_list, limit_remove, limit_set

ACTOR = "test:ops"
KEY = "api:key:acme-app"


def limits(engine) -> set[tuple]:
    with engine.connect() as conn:
        return {
            (lim.kind, lim.tenant_id, lim.created_by, lim.concurrency) for lim in limit_list(conn)
        }


def test_an_operators_limit_made_after_the_keys_check_is_not_overwritten(engine, tenant):
    with engine.connect() as keys, keys.begin():
        assert limit_list(keys, tenant_id=tenant) == []  # the API's check: nothing there
        with engine.begin() as ops:
            limit_set(ops, actor=ACTOR, kind="reindex", tenant_id=tenant, concurrency=1)
        with pytest.raises(ForbiddenError) as refused:
            limit_set(keys, actor=KEY, kind="reindex", tenant_id=tenant, concurrency=50)
        assert refused.value.code == "operator_limit"
    assert limits(engine) == {("reindex", tenant, ACTOR, 1)}


def test_an_operators_limit_over_the_keys_own_is_not_removed_by_the_key(engine, tenant):
    with engine.begin() as conn:
        limit_set(conn, actor=KEY, kind="reindex", tenant_id=tenant, concurrency=50)
    with engine.connect() as keys, keys.begin():
        assert [lim.created_by for lim in limit_list(keys, tenant_id=tenant)] == [KEY]
        with engine.begin() as ops:  # the operator replaces the key's limit
            limit_set(ops, actor=ACTOR, kind="reindex", tenant_id=tenant, concurrency=1)
        with pytest.raises(ForbiddenError) as refused:
            limit_remove(keys, actor="dashboard:key:acme", kind="reindex", tenant_id=tenant)
        assert refused.value.code == "operator_limit"
    assert limits(engine) == {("reindex", tenant, ACTOR, 1)}


def test_a_kind_wide_limit_made_after_the_keys_check_keeps_the_key_out(engine, tenant):
    with engine.connect() as keys, keys.begin():
        assert limit_list(keys, tenant_id=tenant) == []
        with engine.begin() as ops:
            limit_set(ops, actor=ACTOR, kind="reindex", concurrency=2)
        with pytest.raises(ForbiddenError) as refused:
            limit_set(keys, actor=KEY, kind="reindex", tenant_id=tenant, concurrency=50)
        assert refused.value.code == "kind_wide_limit"
    assert limits(engine) == {("reindex", None, ACTOR, 2)}


def test_a_kind_wide_limit_and_a_keys_own_set_at_once_take_turns(engine, tenant):
    """Neither saw the other's uncommitted row: the key's limit escaped the refusal, and
    the kind-wide one's displacement, and governed the tenant's jobs outside the cap."""
    done: list[BaseException | None] = []
    with engine.connect() as ops, ops.begin():
        limit_set(ops, actor=ACTOR, kind="reindex", concurrency=2)  # not committed yet

        def key_sets() -> None:
            try:
                with engine.begin() as keys:
                    limit_set(keys, actor=KEY, kind="reindex", tenant_id=tenant, concurrency=50)
                done.append(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
                done.append(exc)

        worker = threading.Thread(target=key_sets)
        worker.start()
        worker.join(1.0)  # it waits for the operator's transaction, if anything does
        waiting = ops.execute(
            text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
        ).scalar_one()
        assert waiting == 1 and not done
    worker.join(10)
    assert isinstance(done[0], ForbiddenError) and done[0].code == "kind_wide_limit"
    assert limits(engine) == {("reindex", None, ACTOR, 2)}
