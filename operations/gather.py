"""Facts of every node at once, for operations that need to know the other nodes."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import gevent.pool
from gevent.event import AsyncResult
from pyinfra.api import State
from pyinfra.api.facts import get_fact
from pyinfra.context import ctx_host, ctx_state

T = TypeVar("T")


def gather_fact(state: State, fact: type, **kwargs: Any) -> dict[str, Any]:
    """``{node name: fact}`` from every active host, one remote command each, in parallel.

    pyinfra's own ``get_facts`` spawns into the state's pool, which deploy code already
    occupies while it runs (it deadlocks there); a pool of our own does not.
    """
    hosts = list(state.inventory.get_active_hosts())

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
