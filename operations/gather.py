"""Facts of every node at once, for operations that need to know the other nodes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import gevent.pool
from gevent.event import AsyncResult
from pyinfra import host as current_host
from pyinfra.api import FactBase, State
from pyinfra.api.facts import get_fact
from pyinfra.context import ctx_host, ctx_state

T = TypeVar("T")


def gather_fact(state: State, fact: type, **kwargs: Any) -> dict[str, Any]:
    """``{node name: fact}`` from every active host, one remote command each, in parallel.

    pyinfra's own ``get_facts`` spawns into the state's pool, which deploy code already
    occupies while it runs (it deadlocks there); a pool of our own does not.
    """
    hosts = list(state.inventory.get_active_hosts())
    key = _key(fact, kwargs)
    stores = [_read.get((id(state), h.name)) for h in hosts]
    if hosts and all(store is not None and key in store for store in stores):
        return {h.data.get("trainfleet_node", h.name): store[key] for h, store in zip(hosts, stores)}

    def one(host):
        with ctx_host.use(host):
            return get_fact(state, host, fact, kwargs=kwargs)

    pool = gevent.pool.Pool(max(1, min(len(hosts), state.config.PARALLEL or len(hosts))))
    results = pool.map(one, hosts)
    return {host.data.get("trainfleet_node", host.name): result for host, result in zip(hosts, results)}


_once: dict[tuple[int, str], AsyncResult] = {}


def once_per_run(name: str, compute: Callable[[State], T]) -> T:
    """``compute(state)`` once per pyinfra run, however many hosts' deploys ask for it.

    pyinfra runs each host's deploy code in its own greenlet; while the first one gathers
    facts, the others wait here for its result instead of gathering again (N x N execs).
    """
    state = ctx_state.get()
    key = (id(state), name)
    if key in _once:
        return _once[key].get()
    result: AsyncResult = AsyncResult()
    _once[key] = result
    try:
        value = compute(state)
    except BaseException as exc:
        result.set_exception(exc)
        raise
    result.set(value)
    return value


# (state, host) -> {(fact, its arguments): value}: what read_once gathered for this run.
_read: dict[tuple[int, str], dict[tuple[Any, ...], Any]] = {}


def _key(fact: type, kwargs: dict[str, Any]) -> tuple[Any, ...]:
    return (fact, tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in kwargs.items())))


def read_once(bundle: type[FactBase], **kwargs: Any) -> None:
    """Read every fact a deploy's operations need, for every host, in ONE remote command per
    host, once per run (a FactBundle); ``fact()`` and ``gather_fact()`` then answer from it.

    pyinfra has no fact cache: without this, each operation's fact is its own round trip.
    """
    def compute(state: State) -> None:
        parts = bundle().parts(**kwargs)
        hosts = {h.data.get("trainfleet_node", h.name): h for h in state.inventory.get_active_hosts()}
        for node, sections in gather_fact(state, bundle, **kwargs).items():
            if sections:  # a host that could not be read asks again, and fails, in its operations
                _read[(id(state), hosts[node].name)] = {
                    _key(cls, fact_kwargs): sections[name] for name, (cls, fact_kwargs) in parts.items()}

    once_per_run(f"read once: {bundle.__name__}", compute)


def fact(cls: type[FactBase], **kwargs: Any) -> Any:
    """The current host's fact: from this run's ``read_once`` if it read it, else read now."""
    store = _read.get((id(ctx_state.get()), current_host.name))
    key = _key(cls, kwargs)
    if store is not None and key in store:
        return store[key]
    return current_host.get_fact(cls, **kwargs)
