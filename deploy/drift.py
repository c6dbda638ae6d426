"""Drift detection, read-only: ``pyinfra inventories/prod.py deploy/drift.py``.

One fingerprint per node (one remote command each), compared against the spec, against
the other nodes (majority vote) and for uniqueness (hostname, boot_id, machine-id). A table
of what differs goes to stderr, the JSON report to .trainfleet/reports/drift-<cluster>.json
(TRAINFLEET_DRIFT_JSON=- also prints it to stdout). A node that drifted, or cannot be read,
fails: the run exits non-zero. Nothing on any node is changed.
"""

from checks import drift_check
from operations import verdict
from runtime.gather import this_node

cluster, node = this_node()

found = drift_check.cluster_report(cluster)
verdict.verdict(
    name="Node matches the spec and its peers",
    check="drift",
    problems=[str(f) for f in found.findings_for(node.name)],
    passed="matches the spec and its peers",
)
