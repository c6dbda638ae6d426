"""The derived view of a validated spec: nodes with ranks, peers, names and addresses.

Everything cross-node (every peer's address, ranks, the master) is computed here,
from the spec alone, so operations never share state through a run.

Built by ``spec.load_cluster`` and ``spec.parse_cluster``, which validate the spec first: this
module imports none of the spec's schema, so a capability can use it and declare its section.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from trainfleet.defaults import VENV_DIR


@dataclass(frozen=True)
class Node:
    """One server of the cluster, as the spec declares it."""

    name: str
    address: str
    rank: int
    gpus: int
    ssh: dict[str, Any]
    nccl: dict[str, Any]
    domain: str | None = None
    npus: int = 0  # Ascend NPUs: the HCCL rank table's devices

    @property
    def fqdn(self) -> str | None:
        return f"{self.name}.{self.domain}" if self.domain else None

    @property
    def slots(self) -> int:
        """Processes the node runs: one per GPU, one on a CPU-only node (gloo)."""
        return self.gpus if self.gpus > 0 else 1

    @property
    def names(self) -> list[str]:
        """Every name the node answers to, FQDN first (the /etc/hosts convention)."""
        return [self.fqdn, self.name] if self.fqdn else [self.name]


VENV_PYTHON = f"{VENV_DIR}/bin/python"  # the venv's python: the ranks' unless the spec names one
CLUSTER_ONLY_SSH = ("mesh", "certificate_days")  # ssh keys that are the cluster's, not a node's


def step_managed(manage: Mapping[str, bool], step: str) -> bool:
    """Whether the spec's ``manage`` map leaves ``step`` to the deploy: every step is managed
    unless turned off."""
    return manage.get(step, True)


@dataclass(frozen=True)
class Cluster:
    """A validated cluster: the spec's settings and its nodes in rank order."""

    name: str
    domain: str | None
    mesh_users: list[str]
    master_port: int
    stack: dict[str, Any]
    nccl: dict[str, Any]
    openmpi: dict[str, Any] = field(default_factory=lambda: {"tcp_include": "auto", "params": {}})
    preflight: dict[str, Any] = field(
        default_factory=lambda: {
            "smoke": None,
            "min_busbw_gbps": None,
            "min_busbw_fraction": 0.33,
            "healthy_multiple_of": None,
            "python": None,
        }
    )
    gpu: dict[str, Any] = field(
        default_factory=lambda: {
            "persistence": True,
            "fabric_manager": "auto",
            "peermem": "auto",
            "memlock": "unlimited",
            "max_clock_offset_ms": 100,
        }
    )
    nodes: list[Node] = field(default_factory=list)
    source: str = "<spec>"
    mesh: str = "certificates"  # ssh.mesh: certificates | keys
    certificate_days: int = 365  # ssh.certificate_days
    # the spec's ``manage``: each step of the deploy -> whether it is managed (a key not here is)
    manage: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def from_spec(cls, spec: dict[str, Any], source: str = "<spec>") -> Cluster:
        domain = spec["cluster"]["domain"]
        nodes = [
            Node(
                name=raw["name"],
                address=raw["address"],
                rank=rank,
                gpus=raw["gpus"],
                npus=raw["npus"],
                ssh={
                    **{k: v for k, v in spec["ssh"].items() if k not in CLUSTER_ONLY_SSH},
                    **raw["ssh"],
                },
                nccl={**spec["nccl"], **raw["nccl"]},
                domain=domain,
            )
            for rank, raw in enumerate(spec["nodes"])
        ]
        return cls(
            name=spec["cluster"]["name"],
            domain=domain,
            mesh_users=list(spec["cluster"]["mesh_users"]),
            master_port=spec["cluster"]["master_port"],
            stack=dict(spec["stack"]),
            nccl=dict(spec["nccl"]),
            openmpi=dict(spec["openmpi"]),
            preflight=dict(spec["preflight"]),
            gpu=dict(spec["gpu"]),
            nodes=nodes,
            source=source,
            mesh=spec["ssh"]["mesh"],
            certificate_days=spec["ssh"]["certificate_days"],
            manage=dict(spec.get("manage") or {}),
        )

    def manages(self, step: str) -> bool:
        """Whether the deploy manages ``step`` (a ``manage`` key: ``hostname``, ``stack``...)."""
        return step_managed(self.manage, step)

    @property
    def unmanaged(self) -> tuple[str, ...]:
        """The steps the spec turned off (``manage: {hostname: false}``), in the spec's order."""
        return tuple(step for step, managed in self.manage.items() if not managed)

    @property
    def job_python(self) -> str:
        """The python the preflight's ranks run: ``preflight.python`` (an existing env, where
        the stack is not managed), else trainfleet's venv."""
        return self.preflight.get("python") or VENV_PYTHON

    @property
    def job_env(self) -> str:
        """The env the launcher files use (its ``bin/``): ``job_python``'s."""
        return self.job_python.rsplit("/bin/", 1)[0]

    @property
    def master(self) -> Node:
        return self.nodes[0]

    def subset(self, names: list[str]) -> Cluster:
        """The cluster of just the named nodes, in rank order and ranked again from 0 (the first
        one kept is the master)."""
        kept = [node for node in self.nodes if node.name in names]
        return replace(self, nodes=[replace(node, rank=i) for i, node in enumerate(kept)])

    @property
    def total_gpus(self) -> int:
        return sum(node.gpus for node in self.nodes)

    @property
    def total_slots(self) -> int:
        """Processes of the whole job (world size)."""
        return sum(node.slots for node in self.nodes)

    @property
    def uses_gpus(self) -> bool:
        return self.total_gpus > 0

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"{name!r} is not a node of cluster {self.name!r}")

    def peers(self, name: str) -> list[Node]:
        return [node for node in self.nodes if node.name != name]

    def hosts_entries(self) -> list[tuple[str, list[str]]]:
        """(address, names) for every node: the content of each node's /etc/hosts block."""
        return [(node.address, node.names) for node in self.nodes]

    def address_of_name(self) -> dict[str, str]:
        """Every cluster name (short and FQDN) -> the address it must resolve to."""
        return {name: node.address for node in self.nodes for name in node.names}
