"""The cluster spec's schema: every key, its type, its default, its grammar and what it means.

One table drives validation (``spec.py``) and the README's reference
(``python -m trainfleet schema``), so the two cannot disagree. Each capability declares its own
section at the end of its module (``ssh``, ``nccl``, ``openmpi``, ``stack``, ``gpu``); the
sections that belong to no capability are here, and ``SPEC`` composes them all. Every value's
grammar, an allowlist, is in ``grammar.py``.
"""

from __future__ import annotations

import json
from typing import Any

from trainfleet.capabilities.gpu_node import GPU
from trainfleet.capabilities.nccl_env import NCCL
from trainfleet.capabilities.openmpi import OPENMPI
from trainfleet.capabilities.ssh_mesh import CLUSTER_SSH, SSH
from trainfleet.capabilities.stack import STACK
from trainfleet.grammar import (
    NULL,
    Key,
    Section,
    address_problem,
    cluster_name_problem,
    hostname_problem,
    non_negative,
    positive_number,
    preflight_python_problem,
    rail_interface_problem,
    rendezvous_port_problem,
    short_name_problem,
    type_name,
    user_problem,
)

CLUSTER = Section(
    doc="Cluster-wide settings.",
    keys={
        "name": Key(
            (str, NULL),
            None,
            "Cluster name, used in reports and the key store; null: the spec file's name.",
            check=cluster_name_problem,
            accepts="`[A-Za-z0-9][A-Za-z0-9._-]{0,63}`",
        ),
        "domain": Key(
            (str, NULL),
            None,
            "DNS domain: /etc/hosts gets `name.domain` beside `name`.",
            check=hostname_problem,
            example="cluster.example.com",
            accepts="RFC 1123 host name",
        ),
        "mesh_users": Key(
            list,
            ["root"],
            "Users that get the passwordless SSH mesh.",
            items=str,
            each=user_problem,
            accepts="user names `[a-z_][a-z0-9_-]{0,31}`, each once",
        ),
        "master_port": Key(
            int,
            29500,
            "Rendezvous port of the master (first) node.",
            check=rendezvous_port_problem,
            accepts="1024-65535",
        ),
        "mixed_subnets": Key(
            bool,
            False,
            "Whether one node may sit outside the /24 every other node shares (false: that "
            "pattern is refused as the typo it usually is).",
            accepts="true or false",
        ),
    },
)

SMOKE_LAUNCHERS = ("torchrun", "mpirun", "deepspeed", "accelerate", "colossalai")


def smoke_launcher_problem(value: Any) -> str | None:
    if value not in SMOKE_LAUNCHERS:
        return f"{value!r} is not one of {', '.join(SMOKE_LAUNCHERS)}"
    return None


# under a third of the median: a slow node (a loaded lab measured a healthy pair at 0.50: #41)
BUSBW_FRACTION = 0.33


def fraction_problem(value: Any) -> str | None:
    return None if 0 < value <= 1 else f"must be above 0 and at most 1, got {value}"


PREFLIGHT = Section(
    doc="What the preflight checks beyond its stages (`deploy/preflight.py`).",
    keys={
        "min_busbw_gbps": Key(
            (int, float, NULL),
            None,
            "Bus bandwidth floor (GB/s, as nccl-tests reports busbw) of the timed all_reduce "
            "between each pair of nodes; a slower pair names its node or link. null: measured and "
            "reported, no floor (CPU nodes: gloo).",
            check=positive_number,
            example=40,
            accepts="a number above 0",
        ),
        "min_busbw_fraction": Key(
            (int, float),
            BUSBW_FRACTION,
            "A node pair whose bus bandwidth is under this fraction of the cluster's median "
            "(each node's best pair's figure, the median of those) is slow against its peers: a "
            "node slow with every partner is named slow and left out, a pair slow only together "
            "is a slow link. The default is robust to a lab's or a shared fabric's noise; raise it "
            "(0.9) where pairs measure alike. Judged with or without `min_busbw_gbps`.",
            check=fraction_problem,
            example=0.8,
            accepts="a number above 0, at most 1",
        ),
        "rails": Key(
            list,
            [],
            "The interfaces of each node's compute rails where the nodes have no RDMA (two or "
            "more, the same names on every node, e.g. a lab's or a cloud's extra NICs): the "
            "bandwidth stage also measures rail-aligned pairs, rail i of one node with rail i of "
            "its partner over that interface alone, and names a slow rail (`node3 rail eth2`). "
            "Nodes with RDMA take their rails from NCCL_IB_HCA instead. []: no interface rails.",
            items=str,
            check=lambda v: None if len(set(v)) == len(v) else f"{v} names an interface twice",
            each=rail_interface_problem,
            example=["eth1", "eth2"],
            accepts="interface names `[A-Za-z0-9_.:@-]{1,15}`, each once",
        ),
        "healthy_multiple_of": Key(
            (int, NULL),
            None,
            "After a preflight that names unfit nodes, its report's healthy subset (the nodes "
            "no problem names) is cut to a multiple of this size, leaving out the last ones in "
            "rank order (a job's data or model parallel size). null: every healthy node.",
            check=positive_number,
            example=2,
            accepts="1 or more",
        ),
        "python": Key(
            (str, NULL),
            None,
            "The python of an existing env on every node (a conda env, a system PyTorch) the "
            "preflight's ranks and smoke job run, and the launcher files use (its `bin/`), where "
            "the stack is not managed (`manage.stack: false`; refused otherwise: a managed stack's "
            "preflight tests the venv it pinned). null: trainfleet's venv.",
            check=preflight_python_problem,
            example="/opt/conda/envs/train/bin/python",
            accepts="an absolute path `<env>/bin/python`, `python3` or `python3.N` of letters, "
            "digits and `._+@,=:~-`, no `..`",
        ),
        "smoke": Key(
            (str, NULL),
            None,
            "Also train the smoke job (two DDP steps, checked) through this launcher's file in "
            '/etc/trainfleet/launch: "the cluster can train with the launcher you use". `--data '
            "trainfleet_smoke=NAME` "
            "overrides it for one run.",
            check=smoke_launcher_problem,
            example="deepspeed",
            accepts=", ".join(f"`{n}`" for n in SMOKE_LAUNCHERS),
        ),
    },
)


def _manage_key(what: str) -> Key:
    return Key(
        bool,
        True,
        f"Whether the deploy manages {what}; false: the deploy leaves it as the node has it and "
        "drift does not compare it with the spec (the preflight still checks what a job needs).",
        accepts="true or false (a YAML boolean)",
    )


# What an existing cluster keeps as it is (docs/adopt.md): each key one step of deploy/cluster.py,
# whose properties drift stops expecting (each capability's MANAGED).
MANAGE = Section(
    doc="What the deploy manages, step by step (default: everything); adopting a running "
    "cluster, turn off what it keeps as it is (docs/adopt.md).",
    keys={
        "hostname": _manage_key("each node's hostname (/etc/hostname, the running name)"),
        "hosts": _manage_key("the cluster's block in /etc/hosts"),
        "ssh_mesh": _manage_key(
            "the SSH mesh (known_hosts, mesh users' keys and certificates, sshd's drop-in, the KRL)"
        ),
        "pdsh": _manage_key("pdsh (installed, talking ssh, its list of the nodes)"),
        "stack": _manage_key(
            "the pinned stack (CUDA, cuDNN, NCCL, OpenMPI, GCC packages, held; the PyTorch venv)"
        ),
        "nccl_env": _manage_key("the NCCL environment (profile.d, /etc/environment, nccl.conf)"),
        "openmpi": _manage_key("each mesh user's ~/.openmpi/mca-params.conf"),
        "launchers": _manage_key("the launcher files in /etc/trainfleet/launch"),
        "gpu_node": _manage_key("memlock, persistence mode, the fabric manager, nvidia_peermem"),
    },
)

NODE = Section(
    doc="One entry per server, in rank order: the first node is the master.",
    keys={
        "name": Key(
            str,
            None,
            "Short hostname the node gets (unique); or a node set (`gpu[001-200]`, "
            "`rack[1-2]-gpu[01-16]`): one node per name, its `address` a matching range "
            "(`192.0.2.[1-200]`) or a first IP address counted up within its /24, every other key "
            "each node's; a later entry naming one of its nodes overrides that node's keys.",
            check=short_name_problem,
            required=True,
            example="gpu-a01",
            accepts="RFC 1123 label: `[A-Za-z0-9]`, inner `-`, 1-63; or a node set of them",
        ),
        "address": Key(
            str,
            None,
            "Cluster address: where peers reach the node (unique).",
            check=address_problem,
            required=True,
            example="192.0.2.11",
            accepts="IPv4 or IPv6, canonical form, no scope id",
        ),
        "gpus": Key(
            int,
            0,
            "GPUs in the node: launcher slots and processes per node.",
            check=non_negative,
            example=8,
            accepts="0 or more",
        ),
        "npus": Key(
            int,
            0,
            "Ascend NPUs in the node (device ids 0..N-1): listed, with the device IPs read on the "
            "node, in the HCCL rank table MindSpore reads "
            "(`/etc/trainfleet/launch/rank_table.json`).",
            check=lambda v: None if 0 <= v <= 8 else f"must be 0 to 8 (hccl_tools' limit), got {v}",
            example=8,
            accepts="0-8",
        ),
        "ssh": SSH,
        "nccl": Section(doc="Per-node NCCL overrides (same keys as `nccl`).", keys=NCCL.keys),
    },
)

# The spec's top-level sections, in the reference's order: one line per section, each from the
# module that owns it.
SPEC = Section(
    doc="The cluster spec.",
    keys={
        "cluster": CLUSTER,
        "ssh": CLUSTER_SSH,
        "stack": STACK,
        "nccl": NCCL,
        "openmpi": OPENMPI,
        "gpu": GPU,
        "preflight": PREFLIGHT,
        "manage": MANAGE,
        # `nodes` is a list of NODE sections; handled by the validator.
    },
)


def reference_markdown() -> str:
    """The README's spec reference, generated from the schema above."""
    out: list[str] = []

    def table(prefix: str, section: Section) -> None:
        out.append(f"`{prefix}`: {section.doc}\n")
        out.append("| key | type | default | accepts | meaning |")
        out.append("|---|---|---|---|---|")
        nested: list[tuple[str, Section]] = []
        for name, key in section.keys.items():
            if isinstance(key, Section):
                nested.append((f"{prefix}.{name}", key))
                out.append(f"| `{name}` | mapping | | | see `{prefix}.{name}` |")
                continue
            default = "required" if key.required else f"`{json.dumps(key.default)}`"
            accepts = key.accepts.replace("|", "\\|")  # a table cell
            out.append(f"| `{name}` | {type_name(key.type)} | {default} | {accepts} | {key.doc} |")
        out.append("")
        for nested_prefix, sub in nested:
            table(nested_prefix, sub)

    for name, section in SPEC.keys.items():
        assert isinstance(section, Section)
        table(name, section)
    table("nodes[]", NODE)
    return "\n".join(out)
