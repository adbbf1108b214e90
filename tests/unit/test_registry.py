"""What a registry accepts as a kind and a handler: refused at registration, with the
field and the rule, rather than found out when jobs never run."""

from __future__ import annotations

import pytest

from postrelay.core.errors import ValidationError
from postrelay.queue import Registry
from postrelay.queue.model import Job


async def reindex(job: Job) -> None:
    pass


async def reindex_again(job: Job) -> None:
    pass


async def streams(job: Job):
    yield job


def plain(job: Job) -> None:
    pass


@pytest.mark.parametrize("kind", ["", "Reindex", "réindex", "email-send", "1st", "x" * 64,
                                  "reindex\n", " reindex", 7, None])
def test_a_kind_no_enum_can_hold_is_refused_by_name(kind: object) -> None:
    with pytest.raises(ValidationError) as refused:
        Registry().register(kind, reindex)  # type: ignore[arg-type]
    assert refused.value.field == "kind" and "lower-case letters" in refused.value.rule


def test_the_longest_kind_an_enum_label_holds_is_accepted() -> None:
    registry = Registry()
    registry.register("k" * 63, reindex)
    assert registry.kinds() == ["k" * 63]


def test_a_second_handler_for_a_kind_is_refused_and_the_first_kept() -> None:
    registry = Registry()
    registry.register("reindex", reindex)
    registry.register("reindex", reindex, timeout=5)  # the same handler again: fine
    with pytest.raises(ValidationError) as refused:
        registry.register("reindex", reindex_again)
    assert refused.value.field == "kind" and "already has a handler" in refused.value.rule
    assert "test_registry.reindex_again" in str(refused.value)
    handler = registry.get("reindex")
    assert handler is not None and handler.fn is reindex and handler.timeout_secs == 5


@pytest.mark.parametrize(("fn", "rule"), [
    (streams, "without yield"), (plain, "must be an async def"), (42, "must be an async def"),
])
def test_a_handler_that_is_not_an_async_def_is_refused(fn: object, rule: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Registry().register("reindex", fn)  # type: ignore[arg-type]
    assert refused.value.field == "handler" and rule in refused.value.rule


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), "5", True, [5]])
def test_a_timeout_that_is_not_a_positive_number_is_refused_by_name(timeout: object) -> None:
    with pytest.raises(ValidationError) as refused:
        Registry().register("reindex", reindex, timeout=timeout)  # type: ignore[arg-type]
    assert refused.value.field == "timeout" and "positive number" in refused.value.rule


def test_an_infinite_timeout_is_no_limit() -> None:
    registry = Registry()
    registry.register("reindex", reindex, timeout=float("inf"))
    handler = registry.get("reindex")
    assert handler is not None and handler.timeout_secs == float("inf")


def test_a_claim_hook_that_is_not_callable_is_refused_by_name() -> None:
    with pytest.raises(ValidationError) as refused:
        Registry().register("reindex", reindex, on_claim=5)  # type: ignore[arg-type]
    assert refused.value.field == "on_claim"
