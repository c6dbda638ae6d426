"""A check run's verdict per node: the operation that fails a node with its problems,
changing nothing."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from operations.remote import fail_command


@operation()
def verdict(check: str, problems: list[str], passed: str):
    """
    A node's verdict in a read-only check run: no change, ever; fails the node with its problems.

    + check: the check's name, prefixed to the problems (``drift``, ``preflight``)
    + problems: this node's problems; none means it passed
    + passed: the no-change message when it passed

    **Example:**

    .. code:: python

        report.verdict(name="Node matches the spec and its peers", check="drift", problems=[],
                       passed="matches the spec and its peers")
    """
    if not problems:
        host.noop(passed)
        return
    yield fail_command(f"{check}: " + "; ".join(problems))
