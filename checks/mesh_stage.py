"""The SSH stage: every node logs in to every node by name as each mesh user."""

from __future__ import annotations

from datetime import UTC, datetime

from pyinfra.api import State

from checks.mesh_verdicts import USER_CERTIFICATE, certificate_verdicts, mesh_problems
from checks.preflight_report import PreflightReport
from checks.stage_runner import run_everywhere
from facts.shell import shell
from runtime.bundle import MeshProofs
from trainfleet.defaults import MESH_PROBE_PARALLEL, MESH_PROBE_TIMEOUT
from trainfleet.keystore import KeyStore
from trainfleet.model import Cluster


def mesh_bound(nodes: int, users: int = 1) -> int:
    """Seconds the SSH stage may take: for each mesh user in turn, every peer probed (a bounded
    number at once, each within MESH_PROBE_TIMEOUT), two rounds of retries, and a margin."""
    rounds = -(-nodes // MESH_PROBE_PARALLEL) + 2
    return max(1, users) * MESH_PROBE_TIMEOUT * rounds + 5


def run_ssh_mesh(state: State, cluster: Cluster, report: PreflightReport, active: set[str]) -> None:
    """Every node logs in to every node by name as each mesh user, host keys verified, no
    prompt: the path pdsh, DeepSpeed's runner, mpirun and Horovod take to start ranks. A node
    that cannot be reached is named once, as unreachable, not again by each of its peers."""
    peers = [n.name for n in cluster.nodes if n.name in active]
    seconds = mesh_bound(len(peers), len(cluster.mesh_users))
    facts = {name: MeshProofs() for name in peers}
    out = run_everywhere(
        state,
        {
            node: shell(
                fact.command(users=cluster.mesh_users, peers=peers).get_raw_value(),
                prefix=("timeout", "-k", "2", str(seconds)),
            )
            for node, fact in facts.items()
        },
        seconds,
    )
    proofs: dict[str, dict[str, dict[str, str]] | None] = {}
    held: dict[str, dict[str, str | None]] = {}  # node -> certificate -> its line
    for node, lines in sorted(out.items()):
        try:
            read = facts[node].process(lines)
        except Exception:  # cut off or unreadable: the verdict says nothing was proven
            proofs[node] = None
            continue
        proofs[node] = {user: read[f"mesh_proof:{user}"] for user in cluster.mesh_users}
        held[node] = {
            **{
                path.rsplit("/", 1)[-1]: line
                for path, line in read["sshd_mesh"]["certificates"].items()
                if line
            },
            **{
                f"{user}{USER_CERTIFICATE}": read[f"mesh_user:{user}"]["certificate"]
                for user in cluster.mesh_users
            },
        }
    report.details["ssh"] = proofs
    report.problems += mesh_problems(cluster, proofs, peers, seconds)
    if cluster.mesh == "certificates":
        now, ca_public = datetime.now(UTC), KeyStore(cluster.name).ca_public()
        validity, problems, warnings = certificate_verdicts(cluster, held, now, ca_public)
        report.details["certificates"] = validity
        report.problems += problems
        report.warnings += warnings
