"""Drift detection, read-only: ``pyinfra inventories/prod.py deploy/drift.py``.

One fingerprint per node (one remote command each), compared against the spec, against
the other nodes (majority vote) and for uniqueness (hostname, boot_id, machine-id). A table
of what differs goes to stderr, the JSON report to .trainfleet/reports/drift-<cluster>.json
(TRAINFLEET_DRIFT_JSON=- also prints it to stdout); ``--data trainfleet_metrics=PATH.prom``
also writes Prometheus metrics there (node_exporter's textfile format, trainfleet/metrics.py).
A node that drifted, or cannot be read, fails: the run exits non-zero. Nothing on any node
is changed.
"""

import sys
from pathlib import Path

from pyinfra import host

from checks import drift_check
from operations import verdict
from runtime.gather import this_node
from trainfleet import metrics as prometheus

cluster, node = this_node()
metrics = host.data.get("trainfleet_metrics")
if metrics is not None and (problem := prometheus.path_problem(metrics)):
    print(f"trainfleet: trainfleet_metrics: {problem}; nothing was run", file=sys.stderr)
    raise SystemExit(2)

found = drift_check.cluster_report(cluster, None if metrics is None else Path(metrics))
verdict.verdict(
    name="Node matches the spec and its peers",
    check="drift",
    problems=[str(f) for f in found.findings_for(node.name)],
    passed="matches the spec and its peers",
)
