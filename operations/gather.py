"""Facts of every node at once, for operations that need to know the other nodes."""

from __future__ import annotations

from typing import Any

import gevent.pool
from pyinfra.api import State
from pyinfra.api.facts import get_fact
from pyinfra.context import ctx_host


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
