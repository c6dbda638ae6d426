"""What every node must look like: one plan per node, plain data.

Built from the cluster model, the facts gathered once this run (each node's network, host
keys and OS family) and the key store. The deploy applies it (``deploy/cluster.py`` gives each
operation its part), drift compares what a node holds with it (``checks/drift_check.py``), the
preflight reads its names and NCCL environment. Every cross-node rule is applied here,
once; a part that cannot be planned carries its problems instead, and then the deploy fails
that node's step and drift expects nothing of it. No pyinfra here, no host touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from trainfleet import certificates, mesh
from trainfleet.capabilities import openmpi
from trainfleet.capabilities.gpu_node import GpuNodePlan, gpu_part
from trainfleet.capabilities.launchers import RANK_TABLE, render_launchers
from trainfleet.defaults import MESH_KEY_NAME, REVOKED_KEYS, SSH_MAIN_CONF, SYSTEM_KNOWN_HOSTS
from trainfleet.hccl import render_rank_table
from trainfleet.keystore import KeyPair, KeyStore
from trainfleet.model import Cluster, Node
from trainfleet.nccl import Derived, derive_cluster, uniform_variables
from trainfleet.pins import Pins, package_pins, torch_requirement, venv_pins
from trainfleet.render import render, render_lines


@dataclass(frozen=True)
class Gathered:
    """The facts of every node the plan needs, ``node -> value``; a node missing was not read.

    + networks: the NcclNetwork fact (interfaces, InfiniBand ports)
    + host_keys: the node's SSH host keys; None when no host keys were gathered at all (the
      preflight's plan needs none), so no fallback to the controller's known_hosts is made
    + os_families: ``debian`` | ``rhel`` | ``unknown``
    + npu_ips: each node's Ascend device IPs (``/etc/hccn.conf``, ``hccn_tool``)
    + gpu_nodes: the GpuNodeState fact (driver, NVSwitches, persistence, peermem, memlock, clock)
    """

    networks: Mapping[str, Any] = field(default_factory=dict)
    host_keys: Mapping[str, list[str]] | None = None
    os_families: Mapping[str, str] = field(default_factory=dict)
    npu_ips: Mapping[str, Mapping[int, str]] = field(
        default_factory=dict
    )  # NpuDeviceIps: device id -> IP
    gpu_nodes: Mapping[str, Any] = field(default_factory=dict)
    sshd: Mapping[str, Any] = field(
        default_factory=dict
    )  # the SshdMesh fact: host certificates, drop-in, KRL
    user_certificates: Mapping[str, Mapping[str, str | None]] = field(
        default_factory=dict
    )  # node -> user -> line
    trust: Mapping[str, Mapping[str, list[str] | None]] = field(
        default_factory=dict
    )  # node -> known_hosts path | user -> block


@dataclass(frozen=True)
class HostsPlan:
    lines: list[str]  # the /etc/hosts block
    names: dict[str, str]  # every cluster name, lower-case -> the address it must resolve to


@dataclass(frozen=True)
class MeshUserPlan:
    user: str
    identity: KeyPair | None  # ~/.ssh/id_trainfleet; None once revoked
    authorized: list[str]  # the authorized_keys block
    config: list[str]  # the ~/.ssh/config block
    certificate: str | None = (
        None  # ~/.ssh/id_trainfleet-cert.pub (ssh.mesh: certificates); None: no file
    )
    refused: frozenset[str] = (
        frozenset()
    )  # ``type base64`` of every revoked mesh key: never kept, even while moving
    moving: bool = (
        False  # some node trusts another way now: identities change only in a run without failures
    )


@dataclass(frozen=True)
class SshdPlan:
    """sshd's part of the mesh: in a certificate mesh, the host certificates, the drop-in that
    names them and the KRL; in a key mesh, none of them (``drop_in`` None removes them)."""

    certificates: dict[str, str]  # host certificate path -> file content
    drop_in: str | None  # /etc/ssh/sshd_config.d/trainfleet-mesh.conf
    revoked_keys: bytes | None  # /etc/ssh/trainfleet_revoked_keys
    problems: list[str] = field(default_factory=list)
    client_drop_in: str | None = None  # /etc/ssh/ssh_config.d/trainfleet-mesh.conf (ssh's KRL)
    moving: bool = False  # some node's known_hosts trusts another way now: certificates change only without failures


@dataclass(frozen=True)
class NcclPlan:
    env: dict[str, str]
    problems: list[str]
    profile: str  # /etc/profile.d/trainfleet-nccl.sh
    environment: list[str]  # the /etc/environment block
    nccl_conf: list[str]  # the /etc/nccl.conf block


@dataclass(frozen=True)
class MpiPlan:
    users: list[str]
    params: dict[str, str]
    lines: list[str]  # the ~/.openmpi/mca-params.conf block
    problems: list[str]


@dataclass(frozen=True)
class LaunchersPlan:
    files: dict[str, tuple[str, str]]  # name -> (content, mode)
    problems: list[str]


@dataclass(frozen=True)
class StackPlan:
    spec: Mapping[
        str, Any
    ]  # the spec's ``stack`` section as operations/stack_ops.py takes it (``driver`` on GPU nodes only)
    packages: Pins  # the exact packages for the node's OS family (empty when it is unknown)
    torch: str | None  # the version ``torch.__version__`` must report
    python: Mapping[str, str]  # the venv's other pinned packages: PEP 503 name -> exact version
    problems: list[str]


@dataclass(frozen=True)
class NodePlan:
    node: Node
    hostname: str
    hosts: HostsPlan
    known_hosts: list[str]
    mesh: list[MeshUserPlan]  # empty in a plan made without the key store
    sshd: SshdPlan | None  # None in a plan made without the key store
    pdsh_nodes: list[str]
    stack: StackPlan
    nccl: NcclPlan
    mpi: MpiPlan
    launchers: LaunchersPlan
    gpu: GpuNodePlan


@dataclass(frozen=True)
class ClusterPlan:
    nodes: dict[str, NodePlan]
    notes: list[str]  # what a person should know about this run's plan (warnings)


def genders_lines(nodes: list[str]) -> list[str]:
    """The /etc/genders block ``pdsh -a`` reads on Debian: ``name trainfleet`` per node."""
    return [f"{name} trainfleet" for name in nodes]


def hosts_lines(cluster: Cluster) -> list[str]:
    """The /etc/hosts block: every node's address and names (the spec alone decides it)."""
    return render_lines("hosts/hosts_block.j2", entries=cluster.hosts_entries())


def cluster_blocks(cluster: Cluster) -> dict[str, list[str]]:
    """The cluster-wide blocks (a line per node) the plan wants on every node, known from the
    spec before any node is read: the bundles' arguments, so a node holding them answers a
    digest instead of N lines (facts/managed_block_facts.py ``tf_block``)."""
    names = [n.name for n in cluster.nodes]
    return {"hosts": hosts_lines(cluster), "genders": genders_lines(names), "machines": names}


def nccl_part(derived: Derived) -> NcclPlan:
    env = derived.env
    return NcclPlan(
        env=dict(env),
        problems=list(derived.problems),
        profile=render("nccl_env/profile.sh.j2", env=env),
        environment=render_lines("nccl_env/environment.j2", env=env),
        nccl_conf=render_lines("nccl_env/nccl.conf.j2", env=env),
    )


def stack_part(stack: Mapping[str, Any], family: str | None, gpus: int = 0) -> StackPlan:
    problems: list[str] = []
    if not gpus and stack.get("driver"):  # the NVIDIA driver is for nodes with GPUs only
        stack = {key: value for key, value in stack.items() if key != "driver"}
    packages: Pins = {}
    if family in ("debian", "rhel"):
        try:
            packages = package_pins(stack, family)
        except ValueError as exc:
            problems.append(str(exc))
    torch = (
        torch_requirement(stack["torch"], stack.get("torch_cuda") or "cpu").split("==", 1)[1]
        if stack.get("torch")
        else None
    )
    python = venv_pins(stack.get("python") or {})
    return StackPlan(spec=stack, packages=packages, torch=torch, python=python, problems=problems)


def rank_table_part(
    cluster: Cluster, npu_ips: Mapping[str, Mapping[int, str]]
) -> tuple[str | None, list[str]]:
    """The HCCL rank table of the cluster's NPU nodes, in spec order, each with devices
    0..npus-1 at the IPs read on it: (the file, None when no node has NPUs; problems)."""
    servers = [n for n in cluster.nodes if n.npus]
    if not servers:
        return None, []
    problems = []
    for node in servers:
        if node.name not in npu_ips:
            problems.append(f"{node.name}'s NPU device IPs could not be read")
            continue
        missing = [d for d in range(node.npus) if d not in npu_ips[node.name]]
        if missing:
            problems.append(
                f"{node.name} has no device IP for NPU {', '.join(map(str, missing))} "
                "(/etc/hccn.conf, hccn_tool -i N -ip -g)"
            )
    if problems:
        return None, problems
    try:
        table = render_rank_table(
            [(n.name, n.address, [(d, npu_ips[n.name][d]) for d in range(n.npus)]) for n in servers]
        )
    except ValueError as exc:
        return None, [str(exc)]
    return table + "\n", []


def mesh_user_part(
    cluster: Cluster,
    node: Node,
    user: str,
    keys: KeyStore,
    authorized: list[str],
    config: list[str],
    certs: mesh.Certificates | None,
    current: str | None,
    refused: frozenset[str] = frozenset(),
    user_moving: bool = False,
) -> MeshUserPlan:
    """A mesh user on a node: its key, and in a certificate mesh the key's certificate for
    the principal ``user`` (kept while valid, signed anew when due)."""
    identity = mesh.identity(user, node, keys)
    certificate = None
    if certs and identity:
        certificate = (
            certs.certificate(
                current,
                identity.public,
                "user",
                [user],
                f"trainfleet:{cluster.name}:{user}@{node.name}",
            )
            + "\n"
        )
    return MeshUserPlan(
        user=user,
        identity=identity,
        authorized=authorized,
        config=config,
        certificate=certificate,
        refused=refused,
        moving=user_moving,
    )


def sshd_part(
    cluster: Cluster,
    node: Node,
    gathered: Gathered,
    certs: mesh.Certificates | None,
    partial: bool = False,
) -> SshdPlan:
    """sshd's certificates, drop-in and KRL on a node (none of them in a key mesh); a node
    whose sshd would not read them, or whose host keys were not read, carries the problem."""
    if certs is None:
        return SshdPlan(certificates={}, drop_in=None, revoked_keys=None)
    found = gathered.sshd.get(node.name)
    host_keys = (gathered.host_keys or {}).get(node.name)
    problems = []
    if found is None or not host_keys:
        problems.append("the node's sshd files or host keys could not be read")
    else:
        if not found["includes_drop_ins"]:
            problems.append(
                "/etc/ssh/sshd_config does not read /etc/ssh/sshd_config.d/*.conf: add "
                "`Include /etc/ssh/sshd_config.d/*.conf` at its top, or set ssh.mesh: keys"
            )
        for path, line in found["certificates"].items():
            if line and not line.split()[-1].startswith("trainfleet:"):
                problems.append(
                    f"{path} holds a host certificate trainfleet did not sign ({line.split()[-1]}): "
                    "move it aside (and its HostCertificate line), or set ssh.mesh: keys"
                )
        for path in found["other_revoked_keys"]:
            problems.append(
                f"{path} sets RevokedKeys, which trainfleet's mesh would override: merge it into the "
                "cluster's (or set ssh.mesh: keys)"
            )
        problems += revoked_host_key_problems(node, host_keys, certs.revoked)
        problems += client_problems(found)
        if not mesh.certified_host_key(host_keys):
            problems.append(
                "the node has no ed25519 (or RSA) host key for the CA to certify: "
                "`ssh-keygen -A` makes one, or set ssh.mesh: keys"
            )
    if certs.moving and partial:
        problems.append(
            "the cluster CA is being replaced (keys rotate-ca) and this run does not reach every node: "
            "deploy the whole cluster at once (a node moved alone would be cut off from the others); "
            "a node that is down: take it out of the spec for now, put it back once "
            "it is up (README, The SSH mesh)"
        )
    if problems:
        return SshdPlan(certificates={}, drop_in=None, revoked_keys=None, problems=problems)
    wanted = mesh.host_certificates(cluster, node, host_keys, found["certificates"], certs)
    drop_in = render(
        "ssh_mesh/sshd_mesh.conf.j2",
        cluster=cluster.name,
        certificates=sorted(wanted),
        revoked_keys=REVOKED_KEYS,
    )
    client = render("ssh_mesh/ssh_mesh.conf.j2", cluster=cluster.name, revoked_keys=REVOKED_KEYS)
    return SshdPlan(
        certificates=wanted, drop_in=drop_in, revoked_keys=certs.revoked_keys, client_drop_in=client
    )


def client_problems(found: Mapping[str, Any]) -> list[str]:
    """Why every user's ssh would not read the cluster's KRL from trainfleet's ssh_config.d file."""
    problems = []
    if not found["client_includes_drop_ins"]:
        problems.append(
            f"{SSH_MAIN_CONF} does not read /etc/ssh/ssh_config.d/*.conf for every "
            "host: add `Include /etc/ssh/ssh_config.d/*.conf` at its top (before any "
            "Host or Match), or set ssh.mesh: keys"
        )
    for path in found["other_revoked_host_keys"]:
        problems.append(
            f"{path} sets RevokedHostKeys: ssh reads one such file, so it or the "
            "cluster's would be ignored: merge it into the cluster's "
            "(or set ssh.mesh: keys)"
        )
    return problems


def revoked_host_key_problems(
    node: Node, host_keys: list[str], revoked: frozenset[str]
) -> list[str]:
    """A node presenting a host key the cluster revoked is not vouched for again (revocation
    is monotone): it is named, with the two ways out."""
    return [
        f"it presents the host key {certificates.fingerprint(key)} ({key.split()[0]}), "
        "which the cluster revoked: give the node new host keys (reimage it, or move "
        "/etc/ssh/ssh_host_*_key* aside, run `ssh-keygen -A` and update the controller's "
        "known_hosts), or, only if that key is known safe, take it back with "
        f"`python -m trainfleet keys readmit SPEC {node.name}`"
        for key in host_keys
        if " ".join(key.split()[:2]) in revoked
    ]


def moving(cluster: Cluster, gathered: Gathered, part: str, lines: list[str]) -> bool:
    """Some node read this run trusts another way than ``lines`` in ``part`` (a user's
    authorized_keys block, or SYSTEM_KNOWN_HOSTS) and not yet these: changing what nodes present now
    would cut it off unless its own trust step held. A node with no block yet (a new node) is
    not moving: nothing of it works yet to be cut."""
    for node in cluster.nodes:
        block = gathered.trust.get(node.name, {}).get(part)
        if block and not set(lines) <= set(block):
            return True
    return False


def presents_ca(cluster: Cluster, gathered: Gathered, ca_public: str) -> bool:
    """Every node presents host and user certificates of ``ca_public`` (and no other's)."""
    for node in cluster.nodes:
        held = [line for line in gathered.sshd[node.name]["certificates"].values() if line]
        held += [
            gathered.user_certificates.get(node.name, {}).get(user) for user in cluster.mesh_users
        ]
        if not held or not all(mesh.signed_by(line, ca_public) for line in held):
            return False
    return True


def plan_cluster(cluster: Cluster, gathered: Gathered, keys: KeyStore | None = None) -> ClusterPlan:
    """Every node's plan. Cluster-wide parts (hosts block, known hosts, authorized keys, ssh
    config, MCA parameters) are built once and shared by every node's plan.

    + keys: the key store; None plans no SSH mesh (the preflight needs none, and reading the
      store would create keys)
    """
    notes: list[str] = []
    derived = derive_cluster(cluster, gathered.networks)
    interfaces = {d.interface for d in derived.values() if d.interface}
    if len(interfaces) > 1:
        notes.append(
            f"cluster interfaces differ between nodes ({', '.join(sorted(interfaces))}): each node gets "
            "its own, but DeepSpeed's and ColossalAI's runners forward the launching node's "
            "NCCL_SOCKET_IFNAME to every node"
        )
    known_hosts: list[str] = []
    if gathered.host_keys is not None and not (keys and cluster.mesh == "certificates"):
        host_keys, fallback = mesh.cluster_host_keys(cluster, gathered.host_keys)
        notes += [
            f"[{name}] not reachable: its host keys come from the controller's known_hosts "
            f"({len(host_keys[name])} found)"
            for name in fallback
        ]
        known_hosts = mesh.known_hosts_lines(cluster, host_keys)

    if keys and cluster.mesh == "certificates" and gathered.host_keys is not None:
        # A host key the CA vouched for that its node no longer presents (reimaged, removed
        # from the spec) keeps a valid certificate: the KRL must refuse it from now on.
        keys.record_host_keys(
            {name: found for name, found in gathered.host_keys.items() if found},
            [n.name for n in cluster.nodes],
        )
    certs = (
        mesh.plan_certificates(cluster, keys) if keys and cluster.mesh == "certificates" else None
    )
    if certs:
        known_hosts = mesh.ca_known_hosts_lines(cluster, certs.ca_public)
    refused = (
        frozenset(" ".join(line.split()[:2]) for line in keys.revoked_keys())
        if keys
        else frozenset()
    )
    partial = not {n.name for n in cluster.nodes} <= set(gathered.sshd)  # nodes not read this run
    if certs and certs.moving and not partial and presents_ca(cluster, gathered, certs.ca_public):
        keys.ca_settled()  # every node already moved to the new CA: partial runs are safe again

    entries = cluster.hosts_entries()
    hosts = HostsPlan(
        lines=hosts_lines(cluster),
        names={name.lower(): address for address, names in entries for name in names},
    )
    users = cluster.mesh_users
    if certs:
        authorized = {
            user: [mesh.ca_authorized_line(cluster, user, certs.ca_public)] for user in users
        }
        groups = mesh.cluster_patterns(cluster, addresses=False)
        config = {
            user: render_lines(
                "ssh_mesh/ssh_config_patterns.j2",
                groups=groups,
                user=user,
                key_name=MESH_KEY_NAME,
                revoked_keys=REVOKED_KEYS,
            )
            for user in users
        }
    else:
        authorized = (
            {user: mesh.authorized_lines(cluster, user, keys) for user in users} if keys else {}
        )
        config = {
            user: render_lines(
                "ssh_mesh/ssh_config.j2", nodes=cluster.nodes, user=user, key_name=MESH_KEY_NAME
            )
            for user in users
        }
    users_moving = (
        {user: moving(cluster, gathered, user, authorized[user]) for user in users} if keys else {}
    )
    hosts_moving = moving(cluster, gathered, SYSTEM_KNOWN_HOSTS, known_hosts)
    params, mpi_problems = openmpi.cluster_params(derived, cluster.openmpi)
    mpi = MpiPlan(
        users=list(users),
        params=params,
        lines=render_lines("openmpi/mca_params.j2", params=params),
        problems=mpi_problems,
    )
    uniform = uniform_variables({name: d.env for name, d in derived.items() if not d.problems})
    pdsh_nodes = [n.name for n in cluster.nodes]
    rank_table, rank_table_problems = rank_table_part(cluster, gathered.npu_ips)

    plans = {}
    shared_files: dict[tuple[Any, ...], str] = {}  # launcher files every node shares, rendered once
    for node in cluster.nodes:
        mine = derived.get(node.name) or Derived(problems=["the node's network could not be read"])
        nccl = nccl_part(mine)
        forward = {k: v for k, v in mine.env.items() if k in uniform}
        files = render_launchers(cluster, node, forward=forward, mca=params, shared=shared_files)
        if node.npus and rank_table:
            files[RANK_TABLE] = (rank_table, "644")
        launchers = LaunchersPlan(
            files=files,
            problems=[f"NCCL environment: {p}" for p in nccl.problems]
            + ([f"rank table: {p}" for p in rank_table_problems] if node.npus else []),
        )
        mesh_users = (
            [
                mesh_user_part(
                    cluster,
                    node,
                    user,
                    keys,
                    authorized[user],
                    config[user],
                    certs,
                    gathered.user_certificates.get(node.name, {}).get(user),
                    refused,
                    users_moving[user],
                )
                for user in users
            ]
            if keys
            else []
        )
        sshd = sshd_part(cluster, node, gathered, certs, partial) if keys else None
        if sshd is not None and hosts_moving:
            sshd = replace(sshd, moving=True)
        plans[node.name] = NodePlan(
            node=node,
            hostname=node.name,
            hosts=hosts,
            known_hosts=known_hosts,
            mesh=mesh_users,
            sshd=sshd,
            pdsh_nodes=pdsh_nodes,
            stack=stack_part(cluster.stack, gathered.os_families.get(node.name), node.gpus),
            nccl=nccl,
            mpi=mpi,
            launchers=launchers,
            gpu=gpu_part(
                cluster.gpu,
                cluster.stack,
                node.gpus,
                gathered.gpu_nodes.get(node.name),
                gathered.networks.get(node.name),
                gathered.os_families.get(node.name),
            ),
        )
    return ClusterPlan(nodes=plans, notes=notes)
