"""Turn a validated cluster into a pyinfra inventory (hosts and their data)."""

from __future__ import annotations

import os
import sys
from functools import cache
from pathlib import Path
from typing import Any, NoReturn

from runtime.controller import configure_pyinfra
from trainfleet import mesh, stamps
from trainfleet.mesh import probe_env_problems
from trainfleet.model import Cluster, Node
from trainfleet.spec import EXIT_BAD_SPEC, SpecError, load_cluster

HostT = tuple[str, dict[str, Any]]


def host_data(cluster: Cluster, node: Node) -> dict[str, Any]:
    """pyinfra connection settings and trainfleet's view for one node."""
    ssh = node.ssh
    data: dict[str, Any] = {
        "ssh_hostname": node.address,
        "ssh_user": ssh["user"],
        "ssh_port": ssh["port"],
        # Host keys are always verified; unknown hosts are refused, never added.
        "ssh_strict_host_key_checking": "yes",
        # Plain data only (pyinfra prints it as JSON); deploys get the model via this_node().
        "trainfleet_spec": str(Path(cluster.source).resolve()),
        "trainfleet_node": node.name,
        "trainfleet_rank": node.rank,
        "trainfleet_gpus": node.gpus,
    }
    if ssh["become"] == "sudo":
        # pyinfra runs every operation and fact through `sudo -H -n -E` (never prompting);
        # runtime/gather.py proves passwordless sudo first, so a password prompt is an error.
        # -E keeps the login session's environment (pam_env's /etc/environment, as every
        # non-login ssh session gets it), so checks see what ranks see, not sudo's reset one.
        data["_sudo"] = True
        data["_preserve_sudo_env"] = True
    if ssh["key"]:
        data["ssh_key"] = str(Path(ssh["key"]).expanduser())
    if ssh["known_hosts"]:
        data["ssh_known_hosts_file"] = str(Path(ssh["known_hosts"]).expanduser())
    return data


def pyinfra_hosts(cluster: Cluster) -> list[HostT]:
    """Every node as a pyinfra host, the controller made ready for that many (open files,
    parallelism: runtime/controller.py)."""
    configure_pyinfra(len(cluster.nodes))
    return [(node.name, host_data(cluster, node)) for node in cluster.nodes]


def load_cluster_or_exit(spec_path: str | Path) -> Cluster:
    """Load the spec for an inventory module; on bad input print every problem and exit 2.

    This runs while pyinfra loads the inventory, before any host is connected to.
    """
    try:
        cluster = load_cluster(spec_path)
    except SpecError as exc:
        _refuse(exc.problems, "in the spec")
    problems = probe_env_problems(len(cluster.nodes), os.environ)
    if problems:
        _refuse(problems, "in the environment")
    known_hosts = {Path(n.ssh["known_hosts"] or "~/.ssh/known_hosts") for n in cluster.nodes}
    unreadable = [mesh.known_hosts_problem(p.expanduser()) for p in sorted(known_hosts)]
    if any(unreadable):  # the plan falls back on it for a node it cannot read
        _refuse([p for p in unreadable if p], "in the controller's known_hosts")
    try:  # the preflight's stamps, which the deploy, drift and the preflight read later
        stamps.load(cluster.name)
    except ValueError as exc:
        _refuse([str(exc)], "on the controller")
    return cluster


def _refuse(problems: list[str], where: str) -> NoReturn:
    for problem in problems:
        print(f"trainfleet: {problem}", file=sys.stderr)
    print(
        f"trainfleet: {len(problems)} problem(s) {where}; no host was contacted.", file=sys.stderr
    )
    raise SystemExit(EXIT_BAD_SPEC) from None


def this_node() -> tuple[Cluster, Node]:
    """The cluster and the node pyinfra is currently deploying to (inside a deploy file)."""
    from pyinfra import host

    cluster = _cluster_at(host.data.trainfleet_spec)
    return cluster, cluster.node(host.data.trainfleet_node)


@cache
def _cluster_at(spec_path: str) -> Cluster:
    # Validated once already by the inventory; loaded once per run for all hosts.
    return load_cluster(spec_path)
