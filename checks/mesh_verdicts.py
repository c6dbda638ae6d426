"""SSH mesh verdicts: every login proven, and the certificates each node holds."""

from __future__ import annotations

from datetime import datetime, timedelta

from checks.attribution import pattern_problems
from checks.preflight_report import Problem
from trainfleet import certificates
from trainfleet.defaults import RENEW_FRACTION
from trainfleet.mesh import host_principals
from trainfleet.model import Cluster
from trainfleet.text import printable


def mesh_problems(
    cluster: Cluster,
    proofs: dict[str, dict[str, dict[str, str]] | None],
    names: list[str],
    seconds: int,
) -> list[Problem]:
    """The SSH stage: ``proofs[node][user][peer] = "ok" | reason`` (None: the node's probe
    gave no complete answer) over the reachable ``names``. Every peer of every mesh user must
    be "ok": a probe that did not run, or a peer missing from it, is a failure, never a pass.
    A node's login to itself is its own; the logins between nodes are judged by their pattern
    (checks.attribution), for each user: a node no peer logs in to, or that logs in to none,
    alone; a single failing pair as a link; a pattern no node or link explains on every node."""
    problems = [
        Problem("ssh", node, f"its SSH probes gave no complete answer within {seconds} s")
        for node in names
        if proofs.get(node) is None
    ]
    answered = [node for node in names if proofs.get(node) is not None]
    for user in cluster.mesh_users:
        results = {node: (proofs[node] or {}).get(user) or {} for node in answered}
        failed = {
            (node, peer): results[node].get(peer, "not probed")
            for node in answered
            for peer in names
            if results[node].get(peer) != "ok"
        }
        problems += [
            Problem("ssh", node, f"as {user}, cannot ssh to itself: {printable(why)}")
            for (node, peer), why in failed.items()
            if node == peer
        ]
        tested = [(node, peer) for node in answered for peer in answered if node != peer]
        problems += [
            p
            for p in pattern_problems(
                "ssh",
                answered,
                tested,
                failed,
                lambda a, b, user=user, failed=failed: (
                    f"as {user}, {a} cannot ssh to {b}: " + printable(failed[(a, b)])
                ),
            )
            if p not in problems
        ]
    return problems


def certificate_verdicts(
    cluster: Cluster,
    held: dict[str, dict[str, str | None]],
    now: datetime,
    ca_public: str | None = None,
) -> tuple[dict[str, dict[str, str]], list[Problem], list[Problem]]:
    """The certificate mesh's validity on each node: ``{node: {certificate: "N days left"}}``,
    problems (missing, unreadable, not yet or no longer valid, a signature that does not
    verify, not the cluster CA's ``ca_public`` (None: not known here), the wrong type or
    principals: logins fail) and warnings (in the last third of its validity: the next
    deploy signs it again)."""
    renew = timedelta(days=cluster.certificate_days) / RENEW_FRACTION
    validity: dict[str, dict[str, str]] = {}
    problems, warnings = [], []
    for node, certificates_held in sorted(held.items()):
        mine = validity[node] = {}
        if not any(name.endswith("-cert.pub") for name, line in certificates_held.items() if line):
            problems.append(
                Problem("ssh", node, "sshd presents no host certificate: run the deploy")
            )
        for name, line in sorted(certificates_held.items()):
            if not line:
                problems.append(Problem("ssh", node, f"{name} is missing: run the deploy"))
                continue
            try:
                info = certificates.read(line)
            except certificates.CertificateError as exc:
                problems.append(
                    Problem("ssh", node, f"{name} is unreadable ({exc}): run the deploy")
                )
                continue
            left = info.time_left(now)
            mine[name] = f"{left.days} days left (until {info.valid_before:%Y-%m-%d %H:%M} UTC)"
            kind, principals = wanted_certificate(cluster, node, name)
            why = certificates.problem(line, ca_public, kind, principals, now)
            if info.valid_after > now or left <= timedelta(0):
                problems.append(
                    Problem(
                        "ssh",
                        node,
                        f"{name} is not valid now (from {info.valid_after:%Y-%m-%d %H:%M} "
                        f"to {info.valid_before:%Y-%m-%d %H:%M} UTC): run the deploy",
                    )
                )
            elif why:
                problems.append(
                    Problem("ssh", node, f"{name} is not the cluster's ({why}): run the deploy")
                )
            elif left < renew:
                warnings.append(
                    Problem(
                        "ssh",
                        node,
                        f"{name} has {left.days} days left: the next deploy signs it again",
                    )
                )
    return validity, problems, warnings


USER_CERTIFICATE = "'s certificate"  # the preflight names a user's: "<user>'s certificate"


def wanted_certificate(cluster: Cluster, node: str, name: str) -> tuple[str, list[str]]:
    """(kind, principals) a held certificate must have: ``<user>'s certificate`` is a user
    certificate for ``<user>``, any other a host certificate for the node's names."""
    if name.endswith(USER_CERTIFICATE):
        return "user", [name[: -len(USER_CERTIFICATE)]]
    return "host", host_principals(cluster.node(node))
