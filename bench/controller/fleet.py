"""A synthetic N-node cluster, its plan, and what each of its nodes answers.

The answers are the recorded lab node's (``recorded.json``) made this machine (its names, host
keys and network address: ``machine_sections``), then every section a capability says a
converged node answers (its ``converged(plan)``) answered by that section's fact (its
``answer``: the command's output for that value, the recorded rest of the section kept;
``registry_answers``). No section is rewritten here by hand: a section the registry adds is
answered with no edit of the benchmark, from the registry alone where the recording does not
have it. Everything is built once per N, before any timed run; the runs only look answers up.

recorded.json was taken from a key-mesh lab node, before the ``sshd_mesh`` section and the user
certificate's ``file certificate`` line existed: ``Recorded.of`` adds them as such a node prints
them (facts/ssh_mesh_facts.py ``_SSHD_SCRIPT``, ``_USER_PART``: sshd_config includes
sshd_config.d, no other file sets RevokedKeys, and none of trainfleet's sshd files or
certificates exist yet), which is what the plan is made from; a converged node's are the
registry's.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import os
import pickle
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from facts.fingerprint import Parts
from facts.managed_block_facts import file_line
from facts.ssh_mesh_facts import (
    AUTHORIZED_PURPOSE,
    CONFIG_PURPOSE,
    KNOWN_HOSTS_PURPOSE,
    SshdMesh,
)
from runtime.bundle import (
    DeployState,
    NodeFingerprint,
    deploy_sections,
    mesh_proof_sections,
    plan_inputs,
    sections,
)
from runtime.inventory import host_data
from trainfleet.blocks import split_block, with_block
from trainfleet.capabilities import CAPABILITIES
from trainfleet.defaults import (
    MESH_PROBE_PARALLEL,
    MESH_PROBE_TIMEOUT,
    SYSTEM_KNOWN_HOSTS,
)
from trainfleet.hw.sources import CMDLINE, CPUINFO, DMESG, INFINIBAND, LSPCI, NVLINK, SMI_XML, TOPO
from trainfleet.key_preparation import prepare_keys
from trainfleet.keystore import KeyStore
from trainfleet.mesh import probe_stride, probe_targets
from trainfleet.model import Cluster, Node
from trainfleet.plan import cluster_blocks, plan_cluster
from trainfleet.plan_types import ClusterPlan, NodePlan
from trainfleet.spec import load_cluster

MARK = "--trainfleet-fingerprint--"
CLUSTER_PREFIX = 16  # one L2 network holds every node: 198.18.0.0/16
# How each bundle's command is told apart (pyinfra's fake connector: substring, first match wins).
FINGERPRINT_KEY = f"{MARK} identity"  # NodeFingerprint only
DEPLOY_STATE_KEY = f"{MARK} hostname"  # DeployState (NodeFingerprint is matched before it)
HOSTNAME_KEY = "uname -n"  # pyinfra's server.Hostname (the floor)
MESH_MODES = ("certificates", "keys")  # ssh.mesh; the spec's default is certificates


def node_names(nodes: int) -> list[str]:
    return [f"node{i:04d}" for i in range(1, nodes + 1)]


def node_address(index: int) -> str:
    """198.18.0.1 ... 198.18.4.24 for 1..1024 (never connected to; valid for the spec grammar)."""
    i = index - 1
    return f"198.18.{i // 250}.{i % 250 + 1}"


def decoy_address(index: int) -> str:
    """The second NIC the lab gives every node (a dead-end subnet), off the cluster network."""
    i = index - 1
    return f"198.19.{i // 250}.{i % 250 + 1}"


# -- text and framing ------------------------------------------------------------------------


def text_lines(text: str) -> list[str]:
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def joined(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def b64(text: str | bytes) -> str:
    data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    return base64.b64encode(data).decode()


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def sshd_mesh_text(
    drop_in: str | None = None,
    revoked_keys: bytes | None = None,
    certificates: dict[str, str] | None = None,
    includes_drop_ins: bool = True,
    client_drop_in: str | None = None,
) -> str:
    """What SshdMesh's script (facts/ssh_mesh_facts.py ``_SSHD_SCRIPT``) prints on a node holding
    these files, sshd and ssh including their drop-in directories or not, no other
    ``RevokedKeys`` or ``RevokedHostKeys``."""
    value = {
        "includes_drop_ins": includes_drop_ins,
        "other_revoked_keys": [],
        "certificates": certificates or {},
        "drop_in": drop_in,
        "revoked_keys": revoked_keys,
        "client_includes_drop_ins": includes_drop_ins,
        "other_revoked_host_keys": [],
        "client_drop_in": client_drop_in,
    }
    return joined(SshdMesh().answer(value, []))


def hardware_text() -> str:
    """What HardwareState's script (facts/scripts/hardware.sh, drift's ``check`` mode) prints on a
    lab node, which recorded.json predates: no GPU tools, no HCA, so no lspci or kernel log;
    the kernel's command line and CPU flags, a lab node's being its host's (read here)."""

    def ok(name: str, text: str) -> str:
        return f"src {name} ok {base64.b64encode(text.encode()).decode()}"

    flags = [x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags")]
    return joined(
        [
            *(f"src {n} absent" for n in (SMI_XML, NVLINK, TOPO)),
            f"src {LSPCI} skipped",
            f"src {DMESG} skipped",
            ok(CMDLINE, Path("/proc/cmdline").read_text().rstrip("\n")),
            ok(CPUINFO, flags[0] if flags else ""),
            f"src {INFINIBAND} absent",
        ]
    )


def bundle_stdout(
    order: list[str], texts: dict[str, str], memo: dict[str, str], unrecorded: str | None = None
) -> list[str]:
    """A bundle's stdout lines: each section's marker, then its output as ONE base64 line.
    ``memo`` shares the encoded line of a text every node has (one object, pickled once).
    ``unrecorded``: the output of a section ``texts`` lacks (None: an error)."""
    out = []
    for name in order:
        text = texts.get(name, unrecorded)
        if text is None:
            raise KeyError(f"section {name}: not recorded, and no capability's converged says it")
        encoded = memo.get(text)
        if encoded is None:
            encoded = memo[text] = b64(text)
        out += [f"{MARK} {name}", encoded]
    return out


# -- one node ----------------------------------------------------------------------------------


@dataclass
class Machine:
    """What makes a fake node this machine: its host keys (its ids are the registry's:
    trainfleet/capabilities/identity.py ``converged``)."""

    index: int
    host_keys: list[str]  # as /etc/ssh/ssh_host_*_key.pub hold them


def host_key(kind: str, comment: str) -> str:
    key: Any = (
        ed25519.Ed25519PrivateKey.generate()
        if kind == "ssh-ed25519"
        else ec.generate_private_key(ec.SECP256R1())
    )
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    if not public.startswith(kind + " "):
        raise ValueError(f"cannot make a {kind} host key")
    return f"{public} {comment}"


def machine(index: int, name: str, kinds: list[str]) -> Machine:
    return Machine(index=index, host_keys=[host_key(kind, f"root@{name}") for kind in kinds])


@dataclass
class Recorded:
    """The lab node the answers come from."""

    node: str
    address: str
    spec: dict[str, Any]
    fresh: dict[str, str]  # DeployState sections of the freshly booted node
    converged: dict[str, str]  # DeployState sections + the fingerprint's own, after the deploy

    @classmethod
    def of(cls, document: dict[str, Any]) -> Recorded:
        lab = document["header"]["lab"]
        converged = {
            **document["converged"]["fingerprint"],
            **document["converged"]["deploy_state"],
        }
        return cls(
            node=lab["node"],
            address=lab["address"],
            spec=lab["spec"],
            fresh=_with_certificate_parts(dict(document["fresh"]["deploy_state"])),
            converged={"hardware": hardware_text(), **_with_certificate_parts(converged)},
        )

    def key_kinds(self) -> list[str]:
        return [line.split()[0] for line in text_lines(self.converged["host_keys"])]


def _with_certificate_parts(texts: dict[str, str]) -> dict[str, str]:
    """A recording from before the certificate mesh, completed as its node answers today: an
    ``sshd_mesh`` section with none of trainfleet's sshd files, and each mesh user's part with a
    missing ``~/.ssh/id_trainfleet-cert.pub`` (a key-mesh node holds none of them)."""
    out = dict(texts)
    out.setdefault("sshd_mesh", sshd_mesh_text())

    def no_certificate(lines: list[str]) -> list[str]:
        return (
            lines
            if any(line.startswith("file certificate ") for line in lines)
            else [*lines, file_line("certificate", None)]
        )

    for name, text in texts.items():
        if name.startswith("mesh_user:"):
            out[name] = joined(
                [
                    _user_part(line, no_certificate, 1) if line.startswith("user ") else line
                    for line in text_lines(text)
                ]
            )
    return out


def _network(text: str, recorded: Recorded, node: Node, mine: Machine) -> str:
    """The node's own address on the cluster interface (all nodes on one /16), the decoy
    NIC's on a dead-end subnet of its own; loopback and MTUs as recorded."""
    out = []
    for line in text_lines(text):
        fields = line.split(" ")
        if fields[0] == "addr" and len(fields) == 4 and fields[2] == "inet":
            address, _, prefix = fields[3].partition("/")
            if address == recorded.address:
                fields[3] = f"{node.address}/{CLUSTER_PREFIX}"
            elif not ipaddress.ip_address(address).is_loopback:
                fields[3] = f"{decoy_address(mine.index)}/{prefix}"
        out.append(" ".join(fields))
    return joined(out)


def _hostname(text: str, old: str, new: str) -> str:
    return joined([new if line == old else line for line in text_lines(text)])


def machine_sections(
    base: dict[str, str], recorded: Recorded, node: Node, mine: Machine, fresh: bool
) -> dict[str, str]:
    """The parts that are this machine whatever trainfleet did: names a fresh node boots with,
    host keys, network, the address its shells' ssh session came to."""
    # A fresh lab node boots with a DHCP-style name (lab/netns.py: ip-198-18-0-11).
    old, new = (
        (f"ip-{recorded.address.replace('.', '-')}", f"ip-{node.address.replace('.', '-')}")
        if fresh
        else (recorded.node, node.name)
    )
    return {
        **base,
        "hostname": _hostname(base["hostname"], old, new),
        "host_keys": joined(mine.host_keys),
        "network": _network(base["network"], recorded, node, mine),
        # a check's section: the fresh node's recording has none
        **(
            {"nccl_seen": _session(base["nccl_seen"], recorded, node)}
            if "nccl_seen" in base
            else {}
        ),
    }


def _session(text: str, recorded: Recorded, node: Node) -> str:
    """The shells' environment with the ssh session's own address the node's."""
    address = re.compile(rf"(?<![\d.]){re.escape(recorded.address)}(?![\d])")
    return joined([address.sub(node.address, line) for line in text_lines(text)])


def _user_part(line: str, rewrite: Callable[[list[str]], list[str]], field_at: int) -> str:
    """A line whose field ``field_at`` is one base64 line of a script run as the user (tf_as)."""
    fields = line.split(" ")
    inner = base64.b64decode(fields[field_at]).decode("utf-8", "surrogateescape")
    fields[field_at] = b64(joined(rewrite(text_lines(inner))))
    return " ".join(fields)


def registry_answers(
    base: dict[str, str], plan: NodePlan, parts: Parts, only: set[str] | None = None
) -> dict[str, str]:
    """Every section a capability says a converged node answers (``converged(plan)``), as the
    section's fact answers it (its ``answer``, asked as ``parts`` asks: a digest, the probe's
    peers) over ``base``'s text of it (the node's own; none: a section the recording does not
    have, answered from the registry alone). ``only``: just these sections."""
    out = {}
    for capability in CAPABILITIES:
        for section, value in capability.converged(plan).items():
            if only is not None and section not in only:
                continue
            fact_cls, kwargs = parts[section]
            fact: Any = fact_cls()  # every fact in facts/fingerprint.py's FACTS answers
            fact.command(**kwargs)  # the arguments the answer depends on
            out[section] = joined(fact.answer(value, text_lines(base.get(section, ""))))
    return out


def converged_sections(
    base: dict[str, str], plan: NodePlan, parts: Parts, everyone: Parts
) -> tuple[dict[str, str], dict[str, str]]:
    """Every section of a converged node (deploy sections and the fingerprint's own): ``base``
    (its ``machine_sections``) with what the registry says of each (``registry_answers``),
    asked as ``parts`` asks (the bundle's sections: the probe of its targets); and the mesh
    proofs of the probe of ``everyone`` (the full N x N probe's sections)."""
    full = registry_answers(base, plan, everyone, only=set(everyone))
    return {**base, **registry_answers(base, plan, parts)}, full


# -- the fleet -------------------------------------------------------------------------------


@dataclass
class Answers:
    """One node's answers: stdout lines per command kind."""

    deploy_state: list[str]
    fingerprint: list[str] = field(default_factory=list)  # the probe of probe_targets(stride)
    # the probe of every node (TRAINFLEET_DRIFT_MESH=full, or a drift that probes every peer)
    fingerprint_full: list[str] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    hostname: str = ""

    def responses(self) -> dict[Any, Any]:
        """pyinfra's ``fake_responses``: first match wins, so the fingerprint asked for exactly
        this node's probe targets comes first, any other fingerprint next, DeployState after."""
        out: dict[Any, Any] = {}
        if self.fingerprint:
            args = " ".join(
                ["trainfleet", str(MESH_PROBE_PARALLEL), str(MESH_PROBE_TIMEOUT), *self.targets]
            )
            # the last target must end the probe's arguments (")" of the bundle, or su's quote), so
            # a longer peer list that merely starts with these names is not taken for them
            out[re.compile(re.escape(" " + args) + r"(?=\s*\)|')")] = self.fingerprint
            out[FINGERPRINT_KEY] = self.fingerprint_full
        out[DEPLOY_STATE_KEY] = self.deploy_state
        out[HOSTNAME_KEY] = [self.hostname]
        return out


@dataclass
class Fleet:
    nodes: int
    mesh: str  # ssh.mesh: certificates | keys
    spec: Path
    home: Path  # TRAINFLEET_HOME: the key store the deploy reads, drift's reports
    cluster: Cluster
    plan: ClusterPlan
    stride: int  # TRAINFLEET_DRIFT_STRIDE: the mesh probe's stride, pinned
    converged: dict[str, Answers]
    fresh: dict[str, Answers]

    def inventory(self, state: str) -> list[tuple[str, dict[str, Any]]]:
        """pyinfra hosts: ``@fake/<node>`` with trainfleet's host data and the node's answers."""
        answers = self.converged if state == "converged" else self.fresh
        return [
            (
                f"@fake/{node.name}",
                {
                    **host_data(self.cluster, node),
                    "fake_responses": answers[node.name].responses(),
                    "fake_delay": 0,
                    "fake_delay_jitter": 0,
                },
            )
            for node in self.cluster.nodes
        ]

    def write_inventory(self, state: str, path: Path) -> Path:
        with open(path, "wb") as handle:
            pickle.dump(self.inventory(state), handle, protocol=pickle.HIGHEST_PROTOCOL)
        return path

    def env(self) -> dict[str, str]:
        return {"TRAINFLEET_HOME": str(self.home), "TRAINFLEET_DRIFT_STRIDE": str(self.stride)}


@contextmanager
def _unsynced() -> Iterator[None]:
    """The key store fsyncs every key it makes (right for real keys); this store is a throwaway
    temp dir, and 3 fsyncs a node cost minutes at 1024 nodes on this disk."""
    saved = os.fsync
    os.fsync = lambda fd: None  # type: ignore[assignment]
    try:
        yield
    finally:
        os.fsync = saved


def write_spec(nodes: int, workdir: Path, recorded: Recorded, mesh: str = "certificates") -> Path:
    """The lab's spec (cluster, settings) with N nodes and the SSH mesh ``mesh``; ssh as root,
    never connected to."""
    if mesh not in MESH_MODES:
        raise ValueError(f"mesh {mesh!r}: one of {', '.join(MESH_MODES)}")
    spec = {key: value for key, value in recorded.spec.items() if key not in ("nodes", "ssh")}
    spec["ssh"] = {"user": "root", "port": 22, "mesh": mesh}
    spec["nodes"] = [
        {"name": name, "address": node_address(i), "gpus": 0}
        for i, name in enumerate(node_names(nodes), 1)
    ]
    path = workdir / f"fleet-{nodes}.yml"
    path.write_text(
        f"# The controller benchmark's synthetic {nodes}-node cluster "
        "(bench/controller/fleet.py).\n" + yaml.safe_dump(spec, sort_keys=False)
    )
    return path


def parse_bundle(
    kind: str,
    stdout: list[str],
    users: list[str],
    peers: list[str] | None = None,
    blocks: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """A bundle's stdout through the real facts, as pyinfra's gathering gives it to them
    (``blocks``: the cluster-wide blocks it was asked for, trainfleet.plan.cluster_blocks)."""
    bundle = DeployState() if kind == "deploy_state" else NodeFingerprint()
    if kind == "deploy_state":
        bundle.command(users=users, blocks=blocks)
    else:
        bundle.command(users=users, peers=peers or [], blocks=blocks)
    return bundle.process(stdout)


def build(
    nodes: int,
    workdir: Path,
    document: dict[str, Any],
    log: Callable[[str], None] = lambda _: None,
    mesh: str = "certificates",
) -> Fleet:
    """The fleet of ``nodes``: spec, keys (generated here, under ``workdir``/home), the plan
    exactly as the deploy builds it, and every node's converged and fresh answers. In a
    certificate mesh the plan signs each node's host and user certificates with the cluster CA
    (made in the key store here, the one the deploy and drift read), and the converged answers
    carry exactly those certificates: a re-run keeps them (still valid) and changes nothing."""
    recorded = Recorded.of(document)
    workdir.mkdir(parents=True, exist_ok=True)
    spec = write_spec(nodes, workdir, recorded, mesh)
    cluster = load_cluster(spec)
    users = cluster.mesh_users
    home = workdir / "home"
    keys = KeyStore(cluster.name, root=home / "keys")
    kinds = recorded.key_kinds()
    machines = {node.name: machine(i, node.name, kinds) for i, node in enumerate(cluster.nodes, 1)}
    deploy_order = list(deploy_sections(users))
    memo: dict[str, str] = {}

    # The plan from what the nodes answer (network, host keys, OS, NPUs, GPU state), as
    # runtime/gather.deploy_plan builds it: prepare_keys makes each node's mesh keys once.
    base = {
        name: machine_sections(recorded.converged, recorded, node, machines[name], fresh=False)
        for name, node in ((n.name, n) for n in cluster.nodes)
    }
    gathered = {
        # a section the recording lacks printed nothing there yet (its fact's default)
        name: parse_bundle("deploy_state", bundle_stdout(deploy_order, texts, memo, ""), users)
        for name, texts in base.items()
    }
    inputs = plan_inputs(gathered)
    with _unsynced():
        material = prepare_keys(keys, cluster, inputs)
    plan = plan_cluster(cluster, inputs, material)
    log(f"N={nodes} ({mesh}): plan built ({len(plan.nodes)} nodes, notes: {plan.notes or 'none'})")

    names = [n.name for n in cluster.nodes]
    stride = probe_stride(nodes, 0)
    order = list(sections(users, []))
    blocks = cluster_blocks(cluster)
    everyone = mesh_proof_sections(users, names)  # drift's full probe asks every node
    converged, fresh = {}, {}
    for node in cluster.nodes:
        mine = machines[node.name]
        targets = probe_targets(names, node.name, stride)
        parts = sections(users, targets, blocks)  # as the deploy and drift ask this node
        texts, full = converged_sections(base[node.name], plan.nodes[node.name], parts, everyone)
        full_texts = {**texts, **full}
        converged[node.name] = Answers(
            deploy_state=bundle_stdout(deploy_order, texts, memo),
            fingerprint=bundle_stdout(order, texts, memo),
            fingerprint_full=bundle_stdout(order, full_texts, memo),
            targets=targets,
            hostname=node.name,
        )
        fresh_texts = machine_sections(recorded.fresh, recorded, node, mine, fresh=True)
        fresh[node.name] = Answers(
            deploy_state=bundle_stdout(deploy_order, fresh_texts, memo, ""),
            hostname=text_lines(fresh_texts["hostname"])[0],
        )
    return Fleet(
        nodes=nodes,
        mesh=mesh,
        spec=spec,
        home=home,
        cluster=cluster,
        plan=plan,
        stride=stride,
        converged=converged,
        fresh=fresh,
    )


def mesh_files(plan: NodePlan) -> dict[str, int]:
    """The bytes of one node's SSH mesh files as the plan renders them: the managed blocks of
    /etc/ssh/ssh_known_hosts and of each mesh user's authorized_keys and ~/.ssh/config (the block
    with its BEGIN/END lines, as written into an empty file), the user certificates, the host
    certificates, sshd's drop-in and the KRL (each mesh user's files summed over the users)."""

    def block(purpose: str, lines: list[str]) -> int:
        return len(with_block(split_block("", purpose), purpose, lines).encode())

    sshd = plan.ssh_mesh.sshd
    sizes = {
        "known_hosts": block(KNOWN_HOSTS_PURPOSE, plan.ssh_mesh.known_hosts),
        "authorized_keys": sum(
            block(AUTHORIZED_PURPOSE, u.authorized) for u in plan.ssh_mesh.users
        ),
        "ssh_config": sum(block(CONFIG_PURPOSE, u.config) for u in plan.ssh_mesh.users),
        "user_certificate": sum(len((u.certificate or "").encode()) for u in plan.ssh_mesh.users),
        "host_certificates": sum(len(c.encode()) for c in sshd.certificates.values())
        if sshd
        else 0,
        "sshd_drop_in": len((sshd.drop_in or "").encode()) if sshd else 0,
        "revoked_keys": len(sshd.revoked_keys or b"") if sshd else 0,
    }
    return {**sizes, "total": sum(sizes.values())}


MESH_FILE_PATHS = {
    "known_hosts": SYSTEM_KNOWN_HOSTS,
    "authorized_keys": "~/.ssh/authorized_keys",
    "ssh_config": "~/.ssh/config",
    "user_certificate": "~/.ssh/id_trainfleet-cert.pub",
    "host_certificates": "/etc/ssh/ssh_host_<type>_key-cert.pub",
    "sshd_drop_in": "/etc/ssh/sshd_config.d/trainfleet-mesh.conf",
    "revoked_keys": "/etc/ssh/trainfleet_revoked_keys",
}


def section_bytes(lines: list[str]) -> dict[str, int]:
    """A bundle's stdout bytes by section: each section's marker line and its one encoded line."""
    out: dict[str, int] = {}
    name = ""
    for line in lines:
        if line.startswith(MARK + " "):
            name = line[len(MARK) + 1 :]
        out[name] = out.get(name, 0) + len(line.encode("utf-8", "surrogateescape")) + 1
    return out


MESH_SECTIONS = (
    "host_keys",
    "sshd_mesh",
    "known_hosts",
    "mesh_user:",
)  # the SSH mesh's parts of a bundle


def section_group(name: str) -> str:
    """``ssh mesh``, ``hosts + pdsh`` (a line per node in either mesh) or ``other``."""
    if name.startswith(MESH_SECTIONS):
        return "ssh mesh"
    return "hosts + pdsh" if name in ("hosts", "pdsh") else "other"


def stdout_bytes(lines: list[str]) -> int:
    """Bytes of stdout those lines are (UTF-8, one newline each)."""
    return sum(len(line.encode("utf-8", "surrogateescape")) + 1 for line in lines)


def offline_drift(fleet: Fleet, answers: dict[str, Answers] | None = None) -> Any:
    """Drift's comparison of the fleet's converged answers, without pyinfra: each node's
    fingerprint stdout through NodeFingerprint's own parsing, then checks/drift_check.py's
    ``compare_fingerprints``, as checks/drift_check.py's report does. Returns the
    ``trainfleet.compare.Report``."""
    from checks.drift_check import compare_fingerprints

    cluster, users = fleet.cluster, fleet.cluster.mesh_users
    answers = answers or fleet.converged
    fingerprints = {
        name: parse_bundle("fingerprint", a.fingerprint, users, a.targets, cluster_blocks(cluster))
        for name, a in answers.items()
    }
    names = [n.name for n in cluster.nodes]
    keys = KeyStore(cluster.name, root=fleet.home / "keys").snapshot(users, names)  # read only
    return compare_fingerprints(cluster, fingerprints, keys)
