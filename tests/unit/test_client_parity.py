"""The sync `Client` and the `AsyncClient` offer the same methods: the same names, arguments,
defaults, result types and docstrings, the async ones as coroutines. A method added to one
client alone, or an argument renamed in one, fails here."""

from __future__ import annotations

import inspect
from typing import Any

from postrelay.client import AsyncClient, Client

# httpx's names: the async client is closed with `aclose`.
CLOSE = {"close": "aclose"}


def public(cls: type) -> dict[str, Any]:
    return {name: member for name, member in vars(cls).items()
            if not name.startswith("_") and inspect.isfunction(member)}


def test_the_two_clients_have_the_same_methods():
    sync, awaited = public(Client), public(AsyncClient)
    assert {CLOSE.get(name, name) for name in sync} == set(awaited)
    for name, method in sync.items():
        twin = awaited[CLOSE.get(name, name)]
        assert not inspect.iscoroutinefunction(method), name
        assert inspect.iscoroutinefunction(twin), name
        # As written (`Pause`, not `Limit`, though both are dicts) and as evaluated.
        for eval_str in (False, True):
            assert inspect.signature(method, eval_str=eval_str) == inspect.signature(
                twin, eval_str=eval_str), name
        assert inspect.getdoc(method) == inspect.getdoc(twin), name


def test_every_method_says_what_it_does():
    for cls in (Client, AsyncClient):
        for name, method in public(cls).items():
            assert inspect.getdoc(method), f"{cls.__name__}.{name} has no docstring"


def test_the_two_clients_are_made_alike():
    """The same arguments but the transport, whose type is httpx's sync or async one."""
    made = inspect.signature(Client.__init__, eval_str=True).parameters
    twin = inspect.signature(AsyncClient.__init__, eval_str=True).parameters
    assert list(made) == list(twin)
    for name in made.keys() - {"transport"}:
        assert made[name] == twin[name], name
