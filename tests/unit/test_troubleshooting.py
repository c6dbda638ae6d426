"""docs/troubleshooting.md stays true: every failure of issue #28's list has an entry holding the
message as users paste it; each entry names the command that deals with it, quotes trainfleet's
words, and the code really has them (a file that holds the phrase, or a constant that does);
the examples it prints are made here by the functions that print them; what an entry says
trainfleet does not do, the product's code indeed never mentions. Removing an entry, or renaming
or rewording the verdict or constant an entry cites, fails here."""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from checks.bandwidth_verdicts import bandwidth_problems
from checks.collective_verdicts import (
    collective_problems,
    isolate,
    rank_failure,
    version_problems,
)
from checks.fabric_verdicts import ib_port_problems, mtu_problems, nccl_socket_problems
from checks.hygiene_verdicts import hygiene_problems, shm_warnings
from checks.smoke_verdicts import smoke_problems
from tests.unit.test_gpu_node import port
from trainfleet.__main__ import main as trainfleet_main
from trainfleet.capabilities.openmpi import tcp_include
from trainfleet.compare import Finding
from trainfleet.driver_pins import driver_for_cuda_problem
from trainfleet.grammar import env_name_problem
from trainfleet.hccl import rank_table
from trainfleet.hw import kernel_log
from trainfleet.hw.kernel_log import xid_name
from trainfleet.nccl import Derived, cluster_interface, gid_disagreement, ib_settings
from trainfleet.spec import parse_cluster

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "troubleshooting.md"
# The product's own code (what "trainfleet does" can only come from), not the lab or the tests.
PRODUCT = ("trainfleet", "facts", "operations", "runtime", "checks", "deploy", "templates")
THREAD = re.compile(r"\b[A-Za-z0-9][\w.-]*/[\w.-]+#[0-9]+\b")  # owner/repo#N


def _text() -> str:
    return PAGE.read_text()


def _sections() -> dict[str, str]:
    """The page's entries: each ``## `` heading with its body (the intro above them is not one)."""
    parts = re.split(r"^(?=## )", _text(), flags=re.M)
    return {part.splitlines()[0]: part for part in parts if part.startswith("## ")}


def _flat(text: str) -> str:
    """Whitespace as one space: a phrase the page wraps across lines is still found."""
    return " ".join(text.split())


def _entry(message: str) -> str:
    """The one entry whose text holds ``message`` literally."""
    found = [body for body in _sections().values() if message in body]
    assert len(found) == 1, f"{message!r} is in {len(found)} entries of {PAGE.name}, not one"
    return found[0]


# Issue #28's list: each failure's words, all of them in one entry.
ISSUE_LIST = (
    ("ncclSystemError: System call (e.g. socket, malloc) or external library call failed",),
    ("ncclCommInitRank", "accelerator.prepare"),
    ("Duplicate GPU detected",),
    ("NCCL WARN Connect to", "failed: Network is unreachable"),
    ("Call to ibv_modify_qp failed with error Invalid argument",),
    ("torchrun: command not found", "colossalai run"),
    ("address already in use", "29500"),
    ("pml_ucx.c", "Failed to receive UCX worker address"),
    ("SetDevice", "invalid device ordinal", "CUDA_VISIBLE_DEVICES"),
    ("HCCL", "Init plugin so failed, ret = 1343225860"),
    ("GPUs at 100%", "low power", "Using network Socket", "NET/Socket"),
    ("Shared memory left behind after a crash", "ipcs -m"),
    ("pdsh", "mpirun", "this will not preserve the environment"),
)


# Issue #43's list: the messages and symptoms users paste that had no entry, each in one entry.
ISSUE_43_LIST = (
    ("Permission denied (publickey", "Host key verification failed"),
    ("Versions that differ between nodes",),
    ("localhost.localdomain",),
    ("Some NCCL operations have failed or timed out", "failed (exitcode: -6)"),
    ("A driver of version at least", "is required for CUDA"),
    ("Xid (PCI:0000:5d:00): 79", "GPU has fallen off the bus"),
    ("802", "system not yet initialized", "nvidia-fabricmanager"),
    ("ibv_reg_mr", "Cannot allocate memory", "memlock"),
)


@dataclass(frozen=True)
class Claim:
    """An entry (found by ``message``) names ``command`` and quotes ``phrase``; ``source`` really
    has the phrase: a file under the repository root, or ``module:ATTRIBUTE`` whose value holds
    it (a collection's member, else its text)."""

    message: str
    command: str
    phrase: str
    source: str


PREFLIGHT, DRIFT, CLUSTER = "deploy/preflight.py", "deploy/drift.py", "deploy/cluster.py"
SHM_CLEANUP, CHECK = "deploy/shm_cleanup.py", "trainfleet check"
HYGIENE, COLLECTIVE = "checks/hygiene_verdicts.py", "checks/collective_verdicts.py"
FABRIC, NCCL = "checks/fabric_verdicts.py", "trainfleet/nccl.py"
IBV = "Call to ibv_modify_qp failed with error Invalid argument"
HOST_KEY, VERSIONS = "Host key verification failed", "they must be same"
WATCHDOG, INSTALLER = (
    "Some NCCL operations have failed or timed out",
    "A driver of version at least",
)
XID79, ERR802, REG_MR = "Xid (PCI:0000:5d:00): 79", "system not yet initialized", "ibv_reg_mr_iova2"
DIAGNOSE, CAPTURE, HEALTH = (
    "trainfleet diagnose",
    "deploy/capture.py",
    "trainfleet.capabilities.hardware:HEALTH",
)
GPU_NODE, MESH = "trainfleet/capabilities/gpu_node.py", "checks/mesh_verdicts.py"

CLAIMS = (
    # ncclSystemError
    Claim("ncclSystemError: System call", PREFLIGHT, "python exited with status", COLLECTIVE),
    Claim(
        "ncclSystemError: System call",
        PREFLIGHT,
        "every pair with the master fails: the master is at fault",
        COLLECTIVE,
    ),
    Claim(
        "ncclSystemError: System call",
        CLUSTER,
        "NCCL environment not written: ",
        "operations/nccl_env_ops.py",
    ),
    # a hang in ncclCommInitRank / accelerator.prepare
    Claim("accelerator.prepare(model)", PREFLIGHT, "never joined", COLLECTIVE),
    Claim("accelerator.prepare(model)", PREFLIGHT, "the rendezvous at", COLLECTIVE),
    Claim(
        "accelerator.prepare(model)", PREFLIGHT, "cannot reach", "checks/reachability_verdicts.py"
    ),
    Claim(
        "accelerator.prepare(model)",
        CLUSTER,
        "main_process_ip",
        "templates/launchers/accelerate.yaml.j2",
    ),
    Claim("accelerator.prepare(model)", PREFLIGHT, "no python at", "checks/rank_output.py"),
    # Duplicate GPU detected
    Claim("Duplicate GPU detected", PREFLIGHT, "is also the hostname of", HYGIENE),
    Claim("Duplicate GPU detected", PREFLIGHT, "slots, the spec", HYGIENE),
    Claim("Duplicate GPU detected", PREFLIGHT, "GPUs visible (CUDA_VISIBLE_DEVICES=", HYGIENE),
    Claim("Duplicate GPU detected", DRIFT, "is not unique", "trainfleet/compare.py"),
    Claim("Duplicate GPU detected", DRIFT, "boot_id", "trainfleet.capabilities.identity:UNIQUE"),
    Claim("Duplicate GPU detected", DRIFT, "machine-id", "trainfleet.capabilities.identity:UNIQUE"),
    Claim("Duplicate GPU detected", CLUSTER, "hostname", "trainfleet.capabilities.hosts:UNIQUE"),
    # NCCL WARN Connect to ... failed: Network is unreachable
    Claim("failed: Network is unreachable", CLUSTER, "which NCCL must never use", NCCL),
    Claim(
        "failed: Network is unreachable", CLUSTER, "no interface holds the cluster address", NCCL
    ),
    Claim("failed: Network is unreachable", CLUSTER, "docker", "trainfleet.nccl:NEVER"),
    Claim("failed: Network is unreachable", CLUSTER, "veth", "trainfleet.nccl:NEVER"),
    Claim(
        "failed: Network is unreachable",
        DRIFT,
        "NCCL env (non-login ssh)",
        "trainfleet/capabilities/nccl_env.py",
    ),
    Claim("failed: Network is unreachable", PREFLIGHT, "environment ranks get, expected", HYGIENE),
    Claim(
        "failed: Network is unreachable",
        PREFLIGHT,
        "cannot reach",
        "checks/reachability_verdicts.py",
    ),
    # Call to ibv_modify_qp failed with error Invalid argument
    Claim(IBV, CLUSTER, "is RoCE but has no RoCE v2 GID with an IPv4", NCCL),
    Claim(IBV, CLUSTER, "RoCE ports disagree on the RoCE v2 GID index", NCCL),
    Claim(IBV, CLUSTER, "NCCL_IB_GID_INDEX differs between nodes", NCCL),
    Claim(IBV, PREFLIGHT, "NCCL on this node would run without it", FABRIC),
    Claim(IBV, PREFLIGHT, "traffic between them fragments or is dropped", FABRIC),
    Claim(IBV, DRIFT, "ib active MTU", "trainfleet.capabilities.gpu_node:MAJORITY"),
    Claim(IBV, DRIFT, "ib ports active", "trainfleet.capabilities.gpu_node:MAJORITY"),
    # torchrun: command not found under colossalai run
    Claim("torchrun: command not found", PREFLIGHT, "never reported", "checks/smoke_verdicts.py"),
    Claim(
        "torchrun: command not found",
        PREFLIGHT,
        "colossalai",
        "checks.smoke_stage:SMOKE_FROM_MASTER",
    ),
    Claim(
        "torchrun: command not found",
        CLUSTER,
        "colossalai.sh",
        "trainfleet.capabilities.launchers:LAUNCHER_FILES",
    ),
    Claim(
        "torchrun: command not found",
        CLUSTER,
        "/opt/trainfleet/venv",
        "trainfleet.defaults:VENV_DIR",
    ),
    # address already in use on 29500
    Claim("address already in use", PREFLIGHT, "is already in use (", HYGIENE),
    Claim("address already in use", CHECK, "master_port", "trainfleet/schema.py"),
    Claim("address already in use", CLUSTER, "master_port", "templates/launchers/torchrun.sh.j2"),
    # pml_ucx.c ... Failed to receive UCX worker address
    Claim(
        "Failed to receive UCX worker address",
        CLUSTER,
        "btl_tcp_if_include",
        "trainfleet.capabilities.openmpi:PINNED",
    ),
    Claim(
        "Failed to receive UCX worker address",
        CLUSTER,
        "oob_tcp_if_include",
        "trainfleet.capabilities.openmpi:PINNED",
    ),
    Claim(
        "Failed to receive UCX worker address",
        CLUSTER,
        "is unknown; set openmpi.tcp_include in the spec",
        "trainfleet/capabilities/openmpi.py",
    ),
    Claim("Failed to receive UCX worker address", CLUSTER, "UCX_NET_DEVICES", NCCL),
    Claim(
        "Failed to receive UCX worker address",
        DRIFT,
        "openmpi params (",
        "trainfleet/capabilities/openmpi.py",
    ),
    Claim(
        "Failed to receive UCX worker address",
        PREFLIGHT,
        "mpirun",
        "checks.smoke_stage:SMOKE_FROM_MASTER",
    ),
    # SetDevice ... invalid device ordinal with CUDA_VISIBLE_DEVICES
    Claim("invalid device ordinal", PREFLIGHT, "GPUs visible (CUDA_VISIBLE_DEVICES=", HYGIENE),
    Claim("invalid device ordinal", PREFLIGHT, "nvidia-smi is missing (no driver?)", HYGIENE),
    Claim(
        "invalid device ordinal",
        PREFLIGHT,
        "none (CUDA_VISIBLE_DEVICES lists",
        "checks/preflight_stages/collective.py",
    ),
    Claim("invalid device ordinal", PREFLIGHT, "is also the hostname of", HYGIENE),
    # HCCL Init plugin so failed, ret = 1343225860
    Claim(
        "ret = 1343225860",
        CLUSTER,
        "has no device IP for NPU",
        "trainfleet/capabilities/launchers.py",
    ),
    Claim(
        "ret = 1343225860",
        CLUSTER,
        "hccn_tool -i N -ip -g",
        "trainfleet/capabilities/launchers.py",
    ),
    Claim("ret = 1343225860", CLUSTER, "device IPs are unique cluster-wide", "trainfleet/hccl.py"),
    Claim(
        "ret = 1343225860",
        CLUSTER,
        "every server takes part with the same number of devices",
        "trainfleet/hccl.py",
    ),
    Claim(
        "ret = 1343225860",
        CLUSTER,
        "launcher files not written: ",
        "operations/launchers_ops.py",
    ),
    Claim(
        "ret = 1343225860",
        CLUSTER,
        "rank_table.json",
        "trainfleet.capabilities.launchers:RANK_TABLE",
    ),
    Claim("ret = 1343225860", DRIFT, "launcher files", "trainfleet/capabilities/launchers.py"),
    # slow multi-node training: NCCL on sockets instead of IB
    Claim("Using network Socket", PREFLIGHT, "NCCL went over sockets although", FABRIC),
    Claim(
        "Using network Socket",
        PREFLIGHT,
        "NCCL_IB_DISABLE, NCCL_IB_HCA and the RDMA libraries",
        FABRIC,
    ),
    Claim("Using network Socket", PREFLIGHT, "names no network although", FABRIC),
    Claim(
        "Using network Socket",
        PREFLIGHT,
        "NCCL_DEBUG=INFO",
        "checks/preflight_stages/collective.sh",
    ),
    Claim("Using network Socket", PREFLIGHT, "the node is slow", "checks/bandwidth_verdicts.py"),
    Claim("Using network Socket", PREFLIGHT, "min_busbw_fraction", "trainfleet/schema.py"),
    Claim("Using network Socket", PREFLIGHT, "min_busbw_gbps", "trainfleet/schema.py"),
    Claim("Using network Socket", CLUSTER, "nvidia_peermem", "trainfleet/capabilities/gpu_node.py"),
    # leftover shared memory after a crash
    Claim("Shared memory left behind", PREFLIGHT, "stale System V shared memory segment", HYGIENE),
    Claim("Shared memory left behind", PREFLIGHT, "remove with: ", HYGIENE),
    Claim(
        "Shared memory left behind", SHM_CLEANUP, "deploy/shm_cleanup.py", "checks/hygiene_stage.py"
    ),
    Claim("Shared memory left behind", SHM_CLEANUP, "trainfleet_shm_min_idle", SHM_CLEANUP),
    # env set on one node but not seen by ranks started over pdsh/mpirun
    Claim(
        "this will not preserve the environment",
        CLUSTER,
        "/etc/environment",
        "trainfleet.defaults:NCCL_ENVIRONMENT",
    ),
    Claim(
        "this will not preserve the environment",
        CLUSTER,
        "/etc/nccl.conf",
        "trainfleet.defaults:NCCL_CONF",
    ),
    Claim(
        "this will not preserve the environment",
        CLUSTER,
        "/etc/profile.d/trainfleet-nccl.sh",
        "trainfleet.defaults:NCCL_PROFILE",
    ),
    Claim(
        "this will not preserve the environment",
        DRIFT,
        "NCCL env (login shell)",
        "trainfleet/capabilities/nccl_env.py",
    ),
    Claim(
        "this will not preserve the environment",
        DRIFT,
        "the spec wants",
        "trainfleet/compare.py",
    ),
    Claim(
        "this will not preserve the environment",
        PREFLIGHT,
        "environment ranks get, expected",
        HYGIENE,
    ),
)

# issue #43: one-way SSH
CLAIMS_43 = (
    Claim(HOST_KEY, PREFLIGHT, "cannot ssh to", MESH),
    Claim(HOST_KEY, PREFLIGHT, "cannot ssh to itself", MESH),
    Claim(HOST_KEY, CLUSTER, "does not exist on this node", "operations/ssh_mesh_ops.py"),
    Claim(HOST_KEY, CLUSTER, "@cert-authority", "trainfleet/mesh.py"),
    Claim(HOST_KEY, CLUSTER, "/etc/ssh/ssh_known_hosts", "trainfleet.defaults:SYSTEM_KNOWN_HOSTS"),
    Claim(HOST_KEY, CLUSTER, "mesh_users", "trainfleet/schema.py"),
    Claim(HOST_KEY, DRIFT, "ssh mesh (", "trainfleet/capabilities/ssh_mesh.py"),
    # versions that differ between nodes
    Claim(VERSIONS, DRIFT, "the other nodes have", "trainfleet/compare.py"),
    Claim(VERSIONS, DRIFT, "torch", "trainfleet.capabilities.stack:MAJORITY"),
    Claim(VERSIONS, DRIFT, "cuda", "trainfleet.capabilities.stack:MAJORITY"),
    Claim(VERSIONS, DRIFT, "package ", "trainfleet.capabilities.stack:MAJORITY"),
    Claim(VERSIONS, DRIFT, "gpu driver", "trainfleet.capabilities.identity:MAJORITY"),
    Claim(VERSIONS, DRIFT, "kernel", "trainfleet.capabilities.identity:MAJORITY"),
    Claim(VERSIONS, PREFLIGHT, "differs from the other ranks'", COLLECTIVE),
    Claim(VERSIONS, CLUSTER, "allow_change", "trainfleet/capabilities/stack.py"),
    # every node named localhost.localdomain
    Claim("localhost.localdomain", DRIFT, "is not unique", "trainfleet/compare.py"),
    Claim("localhost.localdomain", DRIFT, "hostname", "trainfleet.capabilities.hosts:UNIQUE"),
    Claim("localhost.localdomain", PREFLIGHT, "is also the hostname of", HYGIENE),
    # PyTorch's NCCL watchdog, torchrun's exitcode -6
    Claim(WATCHDOG, PREFLIGHT, "(timed out)", COLLECTIVE),
    Claim(WATCHDOG, PREFLIGHT, "python exited with status", COLLECTIVE),
    Claim(WATCHDOG, DRIFT, "GPU Xid since boot", HEALTH),
    Claim(WATCHDOG, DRIFT, "GPU memory errors", HEALTH),
    Claim(WATCHDOG, DRIFT, "NVLink fabric problems", HEALTH),
    Claim(WATCHDOG, DIAGNOSE, CAPTURE, "trainfleet/__main__.py"),
    # the CUDA runfile's driver warning
    Claim(INSTALLER, CHECK, "is older than CUDA", "trainfleet/driver_pins.py"),
    Claim(INSTALLER, CHECK, "525.60.13", "trainfleet/driver_pins.py"),
    Claim(INSTALLER, DRIFT, "gpu driver", "trainfleet.capabilities.identity:MAJORITY"),
    # Xid 79
    Claim(XID79, DRIFT, "GPU Xid since boot", HEALTH),
    Claim(XID79, DRIFT, "hardware sources", HEALTH),
    Claim(XID79, DRIFT, "GPU has fallen off the bus", "trainfleet/hw/kernel_log.py"),
    Claim(XID79, DIAGNOSE, CAPTURE, "trainfleet/__main__.py"),
    # CUDA error 802
    Claim(ERR802, CLUSTER, "a mismatch is CUDA error 802", GPU_NODE),
    Claim(ERR802, DRIFT, "fabric manager", GPU_NODE),
    Claim(ERR802, DRIFT, "NVLink fabric problems", HEALTH),
    Claim(
        ERR802,
        CHECK,
        "unquoted as booleans: quote such a word where a string",
        "trainfleet/spec.py",
    ),
    # ibv_reg_mr and the locked-memory limit
    Claim(REG_MR, DRIFT, "memlock (non-login ssh)", GPU_NODE),
    Claim(REG_MR, DRIFT, "memlock set elsewhere", GPU_NODE),
    Claim(REG_MR, CLUSTER, "90-trainfleet-memlock.conf", "operations/gpu_node_ops.py"),
    Claim(REG_MR, CLUSTER, "nvidia_peermem", GPU_NODE),
)
CLAIMS = CLAIMS + CLAIMS_43

# What an entry says trainfleet does NOT do: the page says so, and the product's code indeed
# never mentions it. Should trainfleet start handling one, this fails until the entry is updated.
NOT_HANDLED = (
    # (message, what the entry says, a word the product's code would need to handle it)
    ("ret = 1343225860", "trainfleet does not set `RANK_TABLE_FILE`", "RANK_TABLE_FILE="),
    ("Shared memory left behind", "POSIX shared memory files in `/dev/shm`", "/dev/shm"),
    ("Using network Socket", "does not install the RDMA user-space libraries", "ibverbs"),
    ("this will not preserve the environment", "neither reads nor sets sshd's `UsePAM`", "UsePAM"),
    ("Duplicate GPU detected", "is named but not rewritten", "systemd-machine-id-setup"),
    (HOST_KEY, "never runs `ssh-keyscan`", "ssh-keyscan"),
    (WATCHDOG, "`TORCH_NCCL_BLOCKING_WAIT`", "TORCH_NCCL_BLOCKING_WAIT"),
    (INSTALLER, "never runs NVIDIA's runfile installer", "runfile"),
    (REG_MR, "does not set systemd's `LimitMEMLOCK`", "LimitMEMLOCK"),
)


def _source_has(source: str, phrase: str) -> bool:
    if ":" in source:
        module, attribute = source.split(":")
        value = getattr(importlib.import_module(module), attribute)
        return phrase in value  # a str's substring, a collection's member, a mapping's key
    return phrase in (ROOT / source).read_text()


def test_every_failure_of_the_issue_has_an_entry() -> None:
    """Issue #28's list, each failure's words in one entry, and that entry cites the public
    thread it was quoted from."""
    for words in ISSUE_LIST:
        entries = [body for body in _sections().values() if all(w in body for w in words)]
        assert entries, f"no entry of {PAGE.name} holds all of {words}"
        assert THREAD.search(entries[0]), f"the entry for {words} cites no owner/repo#N thread"


def test_every_message_of_issue_43_has_an_entry() -> None:
    """Issue #43's list, each message's words in one entry that cites the public thread it
    was quoted from, and the index links it."""
    for words in ISSUE_43_LIST:
        entries = [body for body in _sections().values() if all(w in body for w in words)]
        assert len(entries) == 1, f"{len(entries)} entries of {PAGE.name} hold all of {words}"
        assert THREAD.search(entries[0]), f"the entry for {words} cites no owner/repo#N thread"


def test_the_page_says_where_diagnose_helps() -> None:
    """`trainfleet diagnose` is in the command table and in the hardware entries."""
    assert (
        "| `pyinfra inventories/<name>.py deploy/capture.py`, then `trainfleet diagnose" in _text()
    )
    for message in (WATCHDOG, XID79, ERR802):
        assert DIAGNOSE in _entry(message), message


def test_each_headings_quoted_message_occurs_verbatim_in_its_entry() -> None:
    """A heading quotes what users paste (`...` where it varies): each quoted part is in the
    entry's own text too (a log excerpt, an example), as the tool prints it."""
    for heading, body in _sections().items():
        text = _flat(body.split("\n", 1)[1])
        for quoted in re.findall(r"`([^`]+)`", heading):
            for part in filter(None, (p.strip() for p in quoted.split("..."))):
                assert part in text, f"{heading}: {part!r} is not in the entry"


def test_every_entry_cites_a_thread_and_names_a_command() -> None:
    sections = _sections()
    assert len(sections) >= len(ISSUE_LIST)
    for heading, body in sections.items():
        assert THREAD.search(body), f"{heading}: no owner/repo#N thread cited"
        assert "**Command.**" in body and "**Not handled.**" in body, heading


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: f"{c.message[:24]}|{c.phrase[:30]}")
def test_entry_names_the_command_and_the_code_has_what_it_quotes(claim: Claim) -> None:
    entry = _entry(claim.message)
    assert claim.command in entry, f"the entry for {claim.message!r} never names {claim.command}"
    assert _flat(claim.phrase) in _flat(entry), (
        f"the entry for {claim.message!r} does not quote {claim.phrase!r}"
    )
    assert _source_has(claim.source, claim.phrase), (
        f"{claim.source} no longer has {claim.phrase!r}: the entry for {claim.message!r} is stale"
    )


def test_every_entry_is_backed_by_claims() -> None:
    """An entry added without claims, or whose message the claims no longer find, fails."""
    backed = {_entry(claim.message).splitlines()[0] for claim in CLAIMS}
    assert backed == set(_sections())


def test_the_commands_the_page_names_exist() -> None:
    for deploy in sorted(set(re.findall(r"deploy/[a-z_]+\.py", _text()))):
        assert (ROOT / deploy).is_file(), f"{PAGE.name} names {deploy}, which does not exist"
    assert "trainfleet check" in _text()
    assert trainfleet_main(["check", str(ROOT / "inventories" / "prod.yml")]) == 0


def test_the_index_links_every_entry() -> None:
    text = _text()
    anchors = set(re.findall(r'<a id="([a-z0-9-]+)"></a>', text))
    links = set(re.findall(r"\]\(#([a-z0-9-]+)\)", text))
    assert links == anchors and len(anchors) == len(_sections())


@pytest.mark.parametrize("message, says, word", NOT_HANDLED, ids=lambda v: str(v)[:30])
def test_what_an_entry_says_trainfleet_does_not_do_it_does_not(
    message: str, says: str, word: str
) -> None:
    assert _flat(says) in _flat(_entry(message)), f"the entry for {message!r} lost {says!r}"
    using = [
        str(path.relative_to(ROOT))
        for folder in PRODUCT
        for path in (ROOT / folder).rglob("*")
        if path.is_file() and path.suffix in (".py", ".sh", ".j2") and word in path.read_text()
    ]
    assert not using, f"{using} now use {word!r}: update the entry for {message!r}"


def test_colossalai_sh_puts_the_venv_first_on_path() -> None:
    """The colossalai entry's claim, in the template itself."""
    template = (ROOT / "templates" / "launchers" / "colossalai.sh.j2").read_text()
    assert 'PATH={{ (venv ~ "/bin")|shell_quote }}:$PATH; export PATH' in template


def test_nccl_env_takes_only_the_names_the_page_lists() -> None:
    """The environment entry: `nccl.env` manages NCCL_/GLOO_/TORCH_/CUDA_/UCX_ names only."""
    entry = _entry("this will not preserve the environment")
    for prefix in ("NCCL_", "GLOO_", "TORCH_", "CUDA_", "UCX_"):
        assert f"`{prefix}`" in entry
        assert env_name_problem(f"{prefix}X") is None
    for name in ("LD_LIBRARY_PATH", "PYTHONPATH"):
        assert name in entry and env_name_problem(name) is not None


# ---- the examples the page prints are what trainfleet prints ------------------------------------

THREE = parse_cluster("""\
nodes:
  - {name: gpu-a01, address: 192.0.2.11, gpus: 8}
  - {name: gpu-a02, address: 192.0.2.12, gpus: 8}
  - {name: gpu-a03, address: 192.0.2.13, gpus: 8}
""")


def _network(address: str, *ports: dict[str, Any]) -> dict[str, Any]:
    iface = {
        "name": "eth0",
        "addresses": [address],
        "cidrs": [f"{address}/24"],
        "bridge": False,
        "mtu": 9000,
    }
    return {"interfaces": [iface], "ib_ports": list(ports)}


def _roce(device: str, *v2: int) -> dict[str, Any]:
    gids = [
        {
            "index": i,
            "type": "RoCE_v2",
            "gid": "0000:0000:0000:0000:0000:ffff:c000:020b",
            "ndev": "ens1",
        }
        for i in v2
    ]
    return {
        "device": device,
        "port": 1,
        "link_layer": "Ethernet",
        "state": "4:ACTIVE",
        "gids": gids,
    }


def _examples() -> list[str]:
    """Each example the page shows, made by the function that prints it, with the page's
    values: the page holds each one word for word."""
    seen = {
        "gpu-a01": {"port_holder": 'users:(("python",pid=4242,fd=3))', "hostname": "node"},
        "gpu-a02": {
            "hostname": "node",
            "visible_gpus": 4,
            "cuda_visible_devices": "0,1,2,3",
            "env": {},
        },
        "gpu-a03": {"hostname": "gpu-a03"},
    }
    hygiene = hygiene_problems(
        THREE, seen, {"gpu-a02": {"NCCL_SOCKET_IFNAME": "=eth0"}}, {"gpu-a02": 16}
    )
    no_smi = hygiene_problems(THREE, {"gpu-a03": {"hostname": "gpu-a03"}}, {}, {})
    networks = {
        "gpu-a01": _network("192.0.2.11", port("mlx5_0", "4:ACTIVE"), port("mlx5_1", "4:ACTIVE")),
        "gpu-a02": _network(
            "192.0.2.12", port("mlx5_0", "4:ACTIVE", 1024), port("mlx5_1", "1:DOWN")
        ),
        "gpu-a03": _network("192.0.2.13", port("mlx5_0", "4:ACTIVE"), port("mlx5_1", "4:ACTIVE")),
    }
    active = {"gpu-a02": {"ib_ports": [port("mlx5_0", "4:ACTIVE")]}}
    stale = [{"shmid": 32769 + i, "bytes": 32 * 2**20, "idle_seconds": 7200} for i in range(3)]
    missing = {"gpu-a02": [[] for _ in range(8)]}
    rendezvous = {
        "step": "timeout",
        "stage": "rendezvous",
        "joined": list(range(8)),
        "missing": list(range(8, 24)),
    }
    unique = Finding("gpu-a01", "hostname", "unique", "node", "also on gpu-a02")
    not_seen = Finding(
        "gpu-a02", "NCCL env (non-login ssh)", "spec", "none", "GLOO_SOCKET_IFNAME=eth0 ..."
    )
    failed = [
        {"step": "joined"},
        {"step": "exit", "code": 1},
        {"step": "stderr", "text": "torch.distributed.DistBackendError: NCCL error ..."},
    ]
    return [
        *(
            f"preflight: {p}"
            for p in hygiene
            if "NCCL_SOCKET_IFNAME" not in p.cause
            and p.cause
            != "its hostname 'node' is also "
            "the hostname of gpu-a01"  # the page shows one of the pair
        ),
        *(p.cause for p in hygiene if "NCCL_SOCKET_IFNAME" in p.cause),
        *(f"preflight: {p}" for p in no_smi),
        *(p.cause for p in ib_port_problems(THREE, networks)),
        *(p.cause for p in mtu_problems(THREE, networks, {n.name: "eth0" for n in THREE.nodes})),
        *(
            f"preflight: {p}"
            for p in nccl_socket_problems(
                THREE, {"gpu-a02": [["h:1:1 [0] NCCL INFO Using network Socket"]]}, active
            )
        ),
        *(
            f"preflight: {p}"
            for p in nccl_socket_problems(THREE, {"gpu-a02": [["NCCL INFO Init COMPLETE"]]}, active)
        ),
        *(w.cause for w in shm_warnings({"gpu-a01": {"stale_shm": stale}}, SHM_HINT)),
        *(
            f"preflight: {p}"
            for p in collective_problems(THREE, {"gpu-a01": [[rendezvous]], **missing})
            if p.node == "gpu-a02"
        ),
        isolate(THREE, {"gpu-a02": True, "gpu-a03": False}, {"gpu-a03": ("gpu-a02", False)})[
            0
        ].cause,
        f"preflight: {smoke_problems(THREE, 'colossalai', {'gpu-a01': SMOKE_OUT})[8]}",
        *(p.cause for p in bandwidth_problems(RING, 20.0) if p.node == "gpu-a01"),
        f"local rank 3 (GPU 3): {rank_failure(failed)}",
        str(unique),
        str(not_seen),
        cluster_interface(
            [{"name": "eth0", "addresses": ["10.0.0.5"], "bridge": False}], "192.0.2.12"
        )[1]
        or "",
        cluster_interface(
            [{"name": "docker0", "addresses": ["192.0.2.12"], "bridge": True}], "192.0.2.12"
        )[1]
        or "",
        *ib_settings([_roce("mlx5_0")])[2],
        *ib_settings([_roce("mlx5_0", 1), _roce("mlx5_1", 3)])[2],
        gid_disagreement({"gpu-a01": 3, "gpu-a02": 1}) or "",
        tcp_include(
            {
                "gpu-a01": Derived(interface="eth0", network="192.0.2.0/24"),
                "gpu-a02": Derived(interface="ens1f0"),
            }
        )[1]
        or "",
        *(_refusal(servers) for servers in RANK_TABLE_REFUSED),
    ]


SHM_HINT = "pyinfra -y <inventory> deploy/shm_cleanup.py"
SMOKE_OUT = ["stderr ...", "exit 1"]  # what colossalai.sh left on the master: its status, stderr
# four nodes in a ring, one slow link between two nodes that reach the floor with their other peer
RING = {
    ("gpu-a01", "gpu-a02"): 3.1,
    ("gpu-a02", "gpu-a03"): 22.0,
    ("gpu-a03", "gpu-a04"): 22.5,
    ("gpu-a04", "gpu-a01"): 21.8,
}
RANK_TABLE_REFUSED = (
    [
        ("npu-01", "192.0.2.21", [(0, "192.168.10.21")]),
        ("npu-02", "192.0.2.22", [(0, "192.168.10.21")]),
    ],
    [
        ("npu-01", "192.0.2.21", [(d, f"192.168.10.{d + 1}") for d in range(8)]),
        ("npu-02", "192.0.2.22", [(d, f"192.168.20.{d + 1}") for d in range(4)]),
    ],
)


def _refusal(servers: list[Any]) -> str:
    with pytest.raises(ValueError) as refused:
        rank_table(servers)
    return f"launcher files not written: rank table: {refused.value}"


def test_the_examples_are_what_trainfleet_prints() -> None:
    page = _flat(_text())
    examples = _examples()
    assert all(examples)
    for example in examples:
        assert _flat(example) in page, f"{PAGE.name} does not show, word for word: {example}"


def test_the_messages_captured_on_a_real_gpu_machine_are_in_their_captures():
    """Each entry that cites a capture of tests/fixtures/hardware/h100_device quotes a line that
    capture holds (the H100 machine's PyTorch and NCCL said it so)."""
    cited = re.findall(
        r"\(`(tests/fixtures/hardware/h100_device/[^`]+)`\):\s*`([^`]+)`", PAGE.read_text()
    )
    assert len(cited) == 3, cited
    for path, message in cited:
        text = (ROOT / path).read_text()
        assert message.replace("\n", " ") in text.replace("\n", " "), (path, message)


def _examples_43() -> list[str]:
    """The examples issue #43's entries show, made by the functions that print them."""
    versions = {"torch": "2.4.1", "cuda": "12.4", "nccl": "2.21.5"}
    differ = version_problems(
        ["gpu-a01", "gpu-a02", "gpu-a03"], [versions, {**versions, "torch": "2.4.0"}, versions]
    )
    localhost = {"hostname": "localhost.localdomain"}
    seen = {"gpu-a01": localhost, "gpu-a02": localhost, "gpu-a03": {"hostname": "gpu-a03"}}
    shared = [p for p in hygiene_problems(THREE, seen, {}, {}) if "of gpu-a01" in p.cause]
    assert len(differ) == 1 and len(shared) == 1
    return [
        str(Finding("gpu-a02", "torch", "majority", "2.4.0", "2.4.1")),
        f"preflight: {differ[0]}",
        str(Finding("gpu-a01", "hostname", "unique", "localhost.localdomain", "also on gpu-a02")),
        f"preflight: {shared[0]}",
        driver_for_cuda_problem("470.82.01", "12.4") or "",
        f"0000:5d:00: {xid_name(79)} x1",
    ]


def test_the_examples_of_issue_43_are_what_trainfleet_prints() -> None:
    page = _flat(_text())
    for example in _examples_43():
        assert example and _flat(example) in page, f"{PAGE.name} does not show: {example}"


def test_the_kernel_lines_quoted_from_fixtures_are_in_them() -> None:
    """An entry that cites a kernel-log fixture quotes a line that fixture holds, and the
    quoted Xid is one the kernel-log parser reads as that Xid."""
    cited = re.findall(
        r"\(`(tests/fixtures/hardware/dmesg/[^`]+)`\):\s*`([^`]+)`", PAGE.read_text()
    )
    assert cited
    for path, line in cited:
        assert line in (ROOT / path).read_text(), (path, line)
        assert [x["xid"] for x in kernel_log.read(line)["xids"]] == [79], line
