"""The node fingerprint: every fact convergence depends on, in one remote command.

It composes the capability facts (each keeps its own command and parser): their
commands run one after another in a single shell, each section marked, and each
section's output goes to that fact's own ``process``. One round trip per node.
"""

from __future__ import annotations

from typing import Any

from pyinfra.api import FactBase, StringCommand
from pyinfra.api.exceptions import FactProcessError

from facts.gpu_node_facts import GpuNodeState
from facts.hosts_facts import HOSTS_PURPOSE, HostnameState
from facts.launchers_facts import LauncherFiles
from facts.managed_block_facts import ManagedBlock, decode_lines, split_sections
from facts.nccl_env_facts import NcclEnvFiles, NcclEnvSeen, NcclNetwork
from facts.npu_facts import NpuDeviceIps
from facts.openmpi_facts import OpenMpiState
from facts.pdsh_facts import PdshState
from facts.ssh_mesh_facts import (
    KNOWN_HOSTS_PURPOSE,
    SshdMesh,
    SshHostKeys,
    SshMeshProof,
    SshMeshUser,
)
from facts.stack_facts import StackVersions
from trainfleet.defaults import LAUNCH_DIR, SYSTEM_KNOWN_HOSTS, VENV_DIR
from trainfleet.plan import Gathered

_MARK = "--trainfleet-fingerprint--"

# Identity and hardware: what makes this machine this machine. GPU lines come from
# nvidia-smi's CSV query (absent on CPU nodes), bounded: a wedged GPU hangs nvidia-smi.
_IDENTITY = r"""
echo "boot_id $(cat /proc/sys/kernel/random/boot_id 2>/dev/null)"
echo "machine_id $(cat /etc/machine-id 2>/dev/null)"
echo "kernel $(uname -r)"
echo "os $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-unknown}")"
if command -v nvidia-smi >/dev/null 2>&1; then
  timeout -k 5 20 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu /'
fi
true
"""


class Identity(FactBase[dict[str, Any]]):
    """
    The machine's identity: boot_id, machine-id, kernel, OS, and its GPUs (model, driver).

    .. code:: python

        {"boot_id": "4b1c...", "machine_id": "a317...", "kernel": "6.8.0-45-generic",
         "os": "Ubuntu 22.04.4 LTS", "gpus": [{"name": "NVIDIA H100 80GB HBM3", "driver": "550.90.07"}]}
    """

    def command(self) -> str:
        return _IDENTITY

    def process(self, output: list[str]) -> dict[str, Any]:
        data: dict[str, Any] = {"gpus": []}
        for line in output:
            key, _, value = line.partition(" ")
            if key == "gpu":
                name, _, driver = value.rpartition(",")
                data["gpus"].append({"name": name.strip(), "driver": driver.strip()})
            else:
                data[key] = value.strip()
        return data


Parts = dict[str, tuple[type[FactBase], dict[str, Any]]]  # section -> (fact, its arguments)


Blocks = list[str] | None  # a cluster-wide block the plan wants (trainfleet.plan.cluster_blocks)


def deploy_sections(
    users: list[str], hosts: Blocks = None, genders: Blocks = None, machines: Blocks = None
) -> Parts:
    """Every fact deploy/cluster.py's operations and the plan read, with the arguments they
    read it with: the one list (``fact()`` refuses one not on it). ``hosts``, ``genders``,
    ``machines``: the planned cluster-wide blocks, answered by digest where a node holds them."""
    hosts_args = {"path": "/etc/hosts", "purpose": HOSTS_PURPOSE}
    parts: Parts = {
        "hostname": (HostnameState, {"path": "/etc/hostname"}),
        "hosts": (ManagedBlock, hosts_args if hosts is None else {**hosts_args, "expect": hosts}),
        "host_keys": (SshHostKeys, {}),
        "sshd_mesh": (SshdMesh, {}),
        "known_hosts": (ManagedBlock, {"path": SYSTEM_KNOWN_HOSTS, "purpose": KNOWN_HOSTS_PURPOSE}),
        "pdsh": (PdshState, {"genders": genders, "machines": machines}),
        "network": (NcclNetwork, {}),
        "nccl_files": (NcclEnvFiles, {}),
        "launchers": (LauncherFiles, {"directory": LAUNCH_DIR}),
        "stack": (StackVersions, {"venv": VENV_DIR}),
        "openmpi": (OpenMpiState, {"users": list(users)}),
        "npus": (NpuDeviceIps, {}),
        "gpu_node": (GpuNodeState, {}),
    }
    for user in users:
        parts[f"mesh_user:{user}"] = (SshMeshUser, {"user": user})
    return parts


def plan_inputs(gathered: dict[str, Any]) -> Gathered:
    """What the plan needs of every node, from each node's sections (``deploy_sections`` or
    ``sections``; a node that could not be read gives nothing)."""
    readable = {node: found for node, found in gathered.items() if found}
    return Gathered(
        networks={node: found["network"] for node, found in readable.items()},
        host_keys={node: found["host_keys"] for node, found in readable.items()},
        os_families={node: found["stack"]["os"]["family"] for node, found in readable.items()},
        npu_ips={node: found["npus"] for node, found in readable.items()},
        gpu_nodes={node: found["gpu_node"] for node, found in readable.items()},
        sshd={node: found["sshd_mesh"] for node, found in readable.items()},
        user_certificates={
            node: {
                key.split(":", 1)[1]: value["certificate"]
                for key, value in found.items()
                if key.startswith("mesh_user:")
            }
            for node, found in readable.items()
        },
        trust={
            node: {
                SYSTEM_KNOWN_HOSTS: found["known_hosts"]["block"],
                **{
                    key.split(":", 1)[1]: value["authorized"]["block"]
                    for key, value in found.items()
                    if key.startswith("mesh_user:")
                },
            }
            for node, found in readable.items()
        },
    )


def sections(users: list[str], peers: list[str], **blocks: Blocks) -> Parts:
    """Everything a converged node is checked on: what the deploy reads, plus the machine's
    identity, the NCCL variables as processes see them and a live probe of the SSH mesh."""
    return {
        "identity": (Identity, {}),
        **deploy_sections(users, **blocks),
        "nccl_seen": (NcclEnvSeen, {}),
        **mesh_proof_sections(users, peers),
    }


def mesh_proof_sections(users: list[str], peers: list[str]) -> Parts:
    """A live probe of every peer as each mesh user (drift's and the preflight's)."""
    return {
        f"mesh_proof:{user}": (SshMeshProof, {"user": user, "peers": list(peers)}) for user in users
    }


def certificate_sections(users: list[str]) -> Parts:
    """The node's host certificates and each mesh user's certificate (the preflight's validity check)."""
    return {
        "sshd_mesh": (SshdMesh, {}),
        **{f"mesh_user:{user}": (SshMeshUser, {"user": user}) for user in users},
    }


class FactBundle(FactBase[dict[str, Any]]):
    """Several facts in one remote command: each fact's command runs in the same shell, its
    output marked, and goes to that fact's own ``process``. Subclasses name the parts."""

    def parts(self, **kwargs: Any) -> Parts:
        raise NotImplementedError

    def command(self, **kwargs: Any) -> StringCommand:
        self._facts: dict[str, FactBase] = {}
        pieces: list[Any] = []
        for name, (fact_cls, fact_kwargs) in self.parts(**kwargs).items():
            fact = fact_cls()
            self._facts[name] = fact
            command = fact.command(**fact_kwargs)
            if isinstance(command, str):
                command = StringCommand(command)
            # Each section's output travels as one base64 line: nothing a file or a user's
            # process prints inside it can end the section or forge another one.
            pieces += [
                "echo",
                f"'{_MARK} {name}';",
                "(",
                command,
                ")",
                "2>/dev/null",
                "|",
                "base64",
                "-w0;",
                "echo;",
            ]
        return StringCommand(*pieces, "true")

    def process(self, output: list[str]) -> dict[str, Any]:
        _, raw = split_sections(output, _MARK)
        result: dict[str, Any] = {}
        for name, fact in self._facts.items():
            encoded = raw.get(name)
            if encoded is None or len(encoded) != 1:
                raise FactProcessError(f"section {name}: missing or not one line")
            try:
                lines = decode_lines(encoded[0])
                # pyinfra gives an empty output the fact's default, not process([]); so do we.
                result[name] = fact.process(lines) if lines else fact.default()
            except Exception as exc:
                raise FactProcessError(
                    f"section {name}: cannot read what the node returned: {exc}"
                ) from exc
        return result


class NodeFingerprint(FactBundle):
    """
    Everything convergence depends on, in one remote command: identity and hardware, the
    names, the SSH mesh (files and a live probe of every peer), pdsh, the network and the
    NCCL variables as non-login and login shells see them, the launcher files, the stack,
    OpenMPI and its parameter files.

    + users: the mesh users
    + peers: every node's name (the mesh probe's targets)
    + hosts, genders, machines: the planned cluster-wide blocks (``deploy_sections``)

    .. code:: python

        {"identity": {...}, "hostname": {"running": "gpu-a01", "static": "gpu-a01"},
         "hosts": {"block": [...], ...}, "mesh_proof:root": {"gpu-a02": "ok"}, "stack": {...}, ...}
    """

    def parts(  # type: ignore[override]
        self,
        users: list[str],
        peers: list[str],
        hosts: Blocks = None,
        genders: Blocks = None,
        machines: Blocks = None,
    ) -> Parts:
        return sections(users, peers, hosts=hosts, genders=genders, machines=machines)

    def command(  # type: ignore[override]
        self,
        users: list[str],
        peers: list[str],
        hosts: Blocks = None,
        genders: Blocks = None,
        machines: Blocks = None,
    ) -> StringCommand:
        blocks = {"hosts": hosts, "genders": genders, "machines": machines}
        return super().command(users=users, peers=peers, **blocks)


class MeshProofs(FactBundle):
    """
    The SSH mesh proved from this node as every mesh user, in one remote command:
    ``{"mesh_proof:<user>": {peer: "ok" | reason}}`` (see SshMeshProof), with the node's host
    and user certificates (``sshd_mesh``, ``mesh_user:<user>``) for their validity.

    + users: the mesh users
    + peers: every node's name
    """

    def parts(self, users: list[str], peers: list[str]) -> Parts:  # type: ignore[override]
        return {**mesh_proof_sections(users, peers), **certificate_sections(users)}

    def command(self, users: list[str], peers: list[str]) -> StringCommand:  # type: ignore[override]
        return super().command(users=users, peers=peers)


class DeployState(FactBundle):
    """
    Every fact deploy/cluster.py's operations read, in one remote command (what the node is
    before this run; pyinfra v3 reads facts before any change, so reading them at once is
    the same as reading them one by one).

    + users: the mesh users
    + hosts, genders, machines: the planned cluster-wide blocks (``deploy_sections``)

    .. code:: python

        {"hostname": {...}, "hosts": {...}, "stack": {...}, "mesh_user:root": {...}, ...}
    """

    def parts(  # type: ignore[override]
        self,
        users: list[str],
        hosts: Blocks = None,
        genders: Blocks = None,
        machines: Blocks = None,
    ) -> Parts:
        return deploy_sections(users, hosts, genders, machines)

    def command(  # type: ignore[override]
        self,
        users: list[str],
        hosts: Blocks = None,
        genders: Blocks = None,
        machines: Blocks = None,
    ) -> StringCommand:
        return super().command(users=users, hosts=hosts, genders=genders, machines=machines)
