"""Preflight: ``pyinfra inventories/prod.py deploy/preflight.py`` proves the cluster can train.

Stages, each bounded in time, all nodes at once:
1. hygiene: master port free, hostnames unique, names resolve alike everywhere, slots =
   GPUs = visible devices, the derived NCCL/Gloo variables in the non-login environment;
2. reachability: every node connects to every peer on its cluster address, and to the
   master's rendezvous port (temporary listeners);
3. ssh: every node logs in to every node by name as each mesh user (host keys verified);
4. a real torch.distributed collective, one rank per GPU (CUDA_VISIBLE_DEVICES honoured; nccl)
   or per CPU node (gloo): all_reduce of a known tensor checked for the right sum, all_gather
   of every rank's versions compared; a rank that cannot run (no venv, no torch, a python that
   cannot start) says why in its own words, by node and local rank/GPU; NCCL's own INFO log
   says which network it used: sockets where IB/RoCE ports are active are named;
5. when 4 fails: 2-rank collectives of the master with each node, then of each suspect with a
   node known good, name the node or link at fault;
6. when 4 passes: the bus bandwidth (nccl-tests' busbw) of a timed all_reduce between each
   pair of nodes, every GPU of both, in rounds, judged against the cluster's median (under
   ``preflight.min_busbw_fraction`` of it, 0.5 by default) and ``preflight.min_busbw_gbps``,
   if set: the slow node (slow with every partner) or the slow link is named by the pattern
   (checks/attribution.py, as reachability's and ssh's failures are). An InfiniBand port down
   on one node while its peers' are active is named (1).
Its worst case for the cluster's size is printed first (checks/preflight_scope.py). A table
goes to stderr, the JSON report to .trainfleet/reports/preflight-<cluster>.json, each tested
node's verdict to preflight-<cluster>-stamps.json beside it: the deploy writes launch files for
the nodes it did not fail in /etc/trainfleet/launch/healthy/. ``--data trainfleet_stale=6h``
tests again only the nodes that passed longer ago, changed since, or never passed. An HTML page
goes beside the JSON (the node x stage grid, the pairs' bandwidth as a heatmap); ``--data
trainfleet_metrics=PATH.prom`` also writes Prometheus metrics (trainfleet/metrics.py).
A node with a problem fails the run. Nothing is left running and nothing is changed, but for
an empty root-only /run/trainfleet: each python runs isolated (``-I``) in a fresh directory
made there and removed, never in /tmp, so no module a node user planted is imported as root.
"""

import sys
from pathlib import Path

from pyinfra import host

from checks import preflight_check
from operations import verdict
from runtime.gather import this_node
from trainfleet import metrics as prometheus
from trainfleet import stamps
from trainfleet.schema import smoke_launcher_problem

cluster, node = this_node()
smoke = host.data.get("trainfleet_smoke") or cluster.preflight["smoke"]
if smoke and (problem := smoke_launcher_problem(smoke)):
    print(f"trainfleet: trainfleet_smoke: {problem}; nothing was run", file=sys.stderr)
    raise SystemExit(2)

stale = host.data.get("trainfleet_stale")
try:
    bound = None if stale is None else stamps.parse_stale(stale)
except ValueError as exc:
    print(f"trainfleet: trainfleet_stale: {exc}; nothing was run", file=sys.stderr)
    raise SystemExit(2) from None

metrics = host.data.get("trainfleet_metrics")
if metrics is not None and (problem := prometheus.path_problem(metrics)):
    print(f"trainfleet: trainfleet_metrics: {problem}; nothing was run", file=sys.stderr)
    raise SystemExit(2)

result = preflight_check.cluster_preflight(
    cluster, smoke=smoke, stale=bound, metrics=None if metrics is None else Path(metrics)
)
verdict.verdict(
    name="This node can train with the others",
    check="preflight",
    problems=[str(p) for p in result.problems_for(node.name)],
    passed="passed every preflight stage",
)
