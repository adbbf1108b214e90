"""tests/conftest.py marks each test by what it needs (tests/README.md)."""

import pytest


def test_a_test_without_database_fixtures_is_pure(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("pure") is not None
    assert request.node.get_closest_marker("postgres") is None
    assert request.node.get_closest_marker("processes") is None


def test_a_test_on_the_database_is_marked_postgres(request: pytest.FixtureRequest,
                                                   database_url: str) -> None:
    assert request.node.get_closest_marker("postgres") is not None
    assert request.node.get_closest_marker("pure") is None


def test_a_test_that_starts_processes_is_marked_so(request: pytest.FixtureRequest,
                                                   worker_env: dict[str, str]) -> None:
    assert request.node.get_closest_marker("processes") is not None
