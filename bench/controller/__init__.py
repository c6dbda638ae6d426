"""The controller-scale benchmark (issue #17): pyinfra driving N fake hosts that answer
trainfleet's fact commands as converged (or fresh) lab nodes would, so only the controller's
own work is timed.

- ``record.py``: the lab node outputs everything is built from (``recorded.json``);
- ``fleet.py``: a synthetic N-node cluster, its plan, and each node's rewritten answers;
- ``inventory.py``: the pyinfra inventory of ``@fake`` hosts that answer with them;
- ``noop_deploy.py``: pyinfra's own cost of as many no-op operations as the deploy runs;
- ``measure.py`` / ``report.py``: the timed runs and docs/controller-benchmark.{json,md,png}.
"""
