"""POSTRELAY_POOLER=transaction: what the one switch turns off, decided without a server."""

from __future__ import annotations

import pytest
from sqlalchemy import make_url

from postrelay.core.db import Database, behind_pooler, pooler_connect_args
from postrelay.core.errors import ConfigError
from postrelay.core.settings import load_settings

URL = make_url("postgresql+psycopg://u@127.0.0.1:6432/db")


def test_the_switch_implies_no_listen(monkeypatch) -> None:
    monkeypatch.delenv("POSTRELAY_NOTIFY", raising=False)
    assert load_settings().listens
    monkeypatch.setenv("POSTRELAY_POOLER", "transaction")
    monkeypatch.setenv("POSTRELAY_NOTIFY", "true")  # the switch wins
    settings = load_settings()
    assert settings.pooler == "transaction" and not settings.listens


def test_a_wrong_pooler_names_the_setting(monkeypatch) -> None:
    monkeypatch.setenv("POSTRELAY_POOLER", "session")
    with pytest.raises(ConfigError, match="POSTRELAY_POOLER"):
        load_settings()


def test_pooled_connections_send_no_options_and_prepare_nothing() -> None:
    args = pooler_connect_args({"options": "-c plan_cache_mode=force_custom_plan",
                                "connect_timeout": 5})
    assert args == {"connect_timeout": 5, "prepare_threshold": None}


def test_engines_carry_the_mode() -> None:
    pooled, direct = Database(URL, pooler=True), Database(URL)
    try:
        assert behind_pooler(pooled.sync_engine()) and behind_pooler(pooled.async_engine(
            connect_args={"options": "-c jit=off"}))
        assert not behind_pooler(direct.sync_engine())
        assert not behind_pooler(direct.async_engine())
    finally:
        pooled.close()
        direct.close()
