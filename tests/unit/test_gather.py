"""The per-run fact store: held on pyinfra's State, strict where read_once gathered."""

from __future__ import annotations

import pytest
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.util import FakeState, create_host

from facts.hosts_facts import HostnameState
from facts.launchers_facts import LauncherFiles
from runtime.gather import _key, fact, lent, run_facts

GATHERED = {"running": "gpu-a01", "static": "gpu-a01"}


def test_a_fact_the_bundle_did_not_gather_is_an_error_not_an_extra_round_trip():
    state = FakeState()
    host = create_host(state, facts={})
    run_facts(state).read[host.name] = {_key(HostnameState, {"path": "/etc/hostname"}): GATHERED}
    with ctx_state.use(state), ctx_host.use(host):
        assert fact(HostnameState, path="/etc/hostname") == GATHERED
        with pytest.raises(RuntimeError, match="was not gathered by read_once"):
            fact(LauncherFiles, directory="/etc/trainfleet/launch")


def test_a_lent_fact_answers_only_while_lent_and_each_run_has_its_own_store():
    state, other = FakeState(), FakeState()
    host = create_host(
        state,
        facts={
            "hosts_facts.HostnameState": {
                "path=/etc/hostname": {"running": "from-the-node", "static": None}
            }
        },
    )
    with ctx_state.use(state), ctx_host.use(host):
        with lent(HostnameState, GATHERED, path="/etc/hostname"):
            assert fact(HostnameState, path="/etc/hostname") == GATHERED
        assert fact(HostnameState, path="/etc/hostname")["running"] == "from-the-node"
    assert run_facts(state) is run_facts(state) and run_facts(state) is not run_facts(other)
