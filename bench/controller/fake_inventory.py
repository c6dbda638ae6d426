"""pyinfra inventory of the controller benchmark's fake nodes: ``@fake/<node>`` hosts with
trainfleet's host data and their canned answers, built before the timed runs
(bench/controller/fleet.py) and loaded here from the pickle ``TRAINFLEET_FLEET`` names. With
``TRAINFLEET_BENCH_WIRE`` set, the fake connector's commands and answers are counted
(bench/controller/wire.py)."""

import os
import pickle

from runtime.controller import configure_pyinfra

if os.environ.get("TRAINFLEET_BENCH_WIRE"):
    from bench.controller import wire

    wire.install(os.environ["TRAINFLEET_BENCH_WIRE"])

with open(os.environ["TRAINFLEET_FLEET"], "rb") as _handle:
    nodes = pickle.load(_handle)

# What runtime.inventory.pyinfra_hosts does for a real inventory: open files and
# parallelism chosen for this many hosts.
configure_pyinfra(len(nodes))
