"""Each fact's ``answer``: what a converged node prints, read back by the fact's own
``process``, is the value it was made from (the controller benchmark derives its nodes'
answers from the capabilities' ``converged`` through these)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from facts.fingerprint import FACTS, Identity
from facts.gpu_node_facts import GpuNodeState
from facts.hardware_facts import HardwareState
from facts.hosts_facts import HOSTS_PURPOSE, HostnameState
from facts.launchers_facts import LauncherFiles
from facts.managed_block_facts import ManagedBlock, encode_lines, file_line
from facts.nccl_env_facts import NcclEnvFiles, NcclEnvSeen, NcclNetwork
from facts.npu_facts import NpuDeviceIps
from facts.openmpi_facts import MCA_PURPOSE, OpenMpiState
from facts.pdsh_facts import PdshState
from facts.ssh_mesh_facts import (
    _HOST_CERT_PATHS,
    CONFIG_PURPOSE,
    SshdMesh,
    SshHostKeys,
    SshMeshProof,
    SshMeshUser,
)
from facts.stack_facts import StackVersions
from trainfleet.blocks import markers
from trainfleet.defaults import (
    NCCL_CONF,
    NCCL_ENVIRONMENT,
    NCCL_PROFILE,
    PDSH_GENDERS,
    PDSH_MACHINES,
    PDSH_RCMD_DEFAULT,
)
from trainfleet.nccl import ENV_PURPOSE

REPO = Path(__file__).resolve().parents[2]
HOSTS = ["198.18.0.1      node0001.lab node0001", "198.18.0.2      node0002.lab node0002"]
OLD = ["198.18.0.9      stale.lab stale"]


def _with(purpose: str, before: list[str], block: list[str]) -> str:
    begin, end = markers(purpose)
    return "".join(f"{line}\n" for line in [*before, begin, *block, end])


def _hosts(expect: list[str] | None) -> ManagedBlock:
    fact = ManagedBlock()
    fact.command(path="/etc/hosts", purpose=HOSTS_PURPOSE, expect=expect)
    return fact


def test_a_managed_block_answers_the_block_in_the_recorded_file_whole_or_by_digest():
    recorded = [file_line("/etc/hosts", _with(HOSTS_PURPOSE, ["127.0.0.1 localhost"], OLD))]
    for expect in (None, HOSTS):
        fact = _hosts(expect)
        state = fact.process(fact.answer({"block": HOSTS, "outside": []}, recorded))
        assert state["block"] == HOSTS
        assert state["outside"] == [(1, "127.0.0.1 localhost")]
        assert (state["text"] is None) == (expect is not None)  # by digest: nothing to rewrite
    # a file with no block yet gets it appended, the user's lines kept
    fact = _hosts(None)
    answer = fact.answer({"block": HOSTS}, [file_line("/etc/hosts", "127.0.0.1 localhost")])
    assert fact.process(answer)["block"] == HOSTS


def test_pdsh_answers_its_blocks_and_keeps_the_recorded_rest():
    names = ["node0001", "node0002"]
    genders = [f"{name} trainfleet" for name in names]
    recorded = [
        "id debian",
        "pdsh /usr/bin/pdsh",
        file_line(PDSH_RCMD_DEFAULT, "ssh\n"),
        file_line("/etc/profile.d/trainfleet-pdsh.sh", None),
        file_line(PDSH_GENDERS, _with("pdsh nodes", [], ["old trainfleet"])),
        file_line(PDSH_MACHINES, _with("pdsh nodes", [], ["old"])),
    ]
    value = {"genders": {"block": genders}, "machines": {"block": names}}
    for genders_expect, machines_expect in ((None, None), (genders, names), (genders, None)):
        fact = PdshState()
        fact.command(genders=genders_expect, machines=machines_expect)
        state = fact.process(fact.answer(value, recorded))
        assert state["genders"]["block"] == genders and state["machines"]["block"] == names
        assert state["installed"] and state["rcmd_default"] == "ssh"


def test_nccl_files_answer_the_profile_and_both_blocks():
    env = ["NCCL_SOCKET_IFNAME==eth1", "NCCL_IB_DISABLE=1"]
    recorded = [
        file_line(NCCL_PROFILE, None),
        file_line(NCCL_ENVIRONMENT, _with(ENV_PURPOSE, ['PATH="/usr/bin"'], ["NCCL_OLD=1"])),
        file_line(NCCL_CONF, "# the admin's\n"),
    ]
    value = {
        "profile": "export NCCL_IB_DISABLE=1\n",
        "environment": {"block": env, "outside": []},
        "nccl_conf": {"block": env[:1], "outside": []},
    }
    fact = NcclEnvFiles()
    state = fact.process(fact.answer(value, recorded))
    assert state["profile"] == value["profile"]
    assert state["environment"]["block"] == env
    assert state["environment"]["outside"] == [(1, 'PATH="/usr/bin"')]
    assert state["nccl_conf"]["block"] == env[:1]
    assert state["nccl_conf"]["outside"] == [(1, "# the admin's")]


def test_openmpi_answers_each_users_block_first_in_the_recorded_file():
    block = ["btl_tcp_if_include = eth1"]
    user_file = [file_line("params", "# the user's\n")]
    recorded = [
        "version mpirun (Open MPI) 4.1.4",
        f"user root 0 root {encode_lines(['/root'])} {encode_lines(user_file)}",
        "user ghost nouser",
    ]
    value = {"users": {"root": {"exists": True, "params": {"block": block}}}}
    state = OpenMpiState().process(OpenMpiState().answer(value, recorded))
    root = state["users"]["root"]
    assert root["params"]["block"] == block and root["home"] == "/root"
    assert root["params"]["text"].startswith(markers(MCA_PURPOSE)[0])  # first in the file
    assert root["params"]["outside"] == [(len(block) + 3, "# the user's")]
    assert state["version"] == "4.1.4" and not state["users"]["ghost"]["exists"]


def test_launchers_answer_the_planned_files_and_keep_the_others():
    recorded = ["644 " + "a" * 64 + " hostfile", "755 " + "b" * 64 + " old.sh"]
    value = {
        "hostfile": {"mode": "644", "sha256": "c" * 64},
        "torchrun.sh": {"mode": "755", "sha256": "d" * 64},
    }
    files = LauncherFiles().process(LauncherFiles().answer(value, recorded))
    assert files == {**value, "old.sh": {"mode": "755", "sha256": "b" * 64}}


def test_sshd_mesh_answers_the_plans_files_and_settings():
    certificate = "ssh-ed25519-cert-v01@openssh.com AAAA root@node0001"
    value = {
        "includes_drop_ins": True,
        "other_revoked_keys": ["/etc/ssh/sshd_config.d/admin.conf"],
        "certificates": {path: None for path in _HOST_CERT_PATHS}
        | {_HOST_CERT_PATHS[2]: certificate},
        "drop_in": b"HostCertificate /etc/ssh/x\n",
        "revoked_keys": b"\x00krl",
        "client_includes_drop_ins": False,
        "other_revoked_host_keys": [],
        "client_drop_in": None,
    }
    answer = SshdMesh().answer(
        {**value, "certificates": {_HOST_CERT_PATHS[2]: certificate + "\n"}}, []
    )
    assert SshdMesh().process(answer) == value


def test_nccl_seen_answers_the_planned_variables_in_both_shells_and_keeps_the_rest():
    recorded = ["@non-login", "NCCL_OLD=1", "HOME=/root", "@login", "UCX_NET_DEVICES=eth9"]
    env = {"NCCL_SOCKET_IFNAME": "=eth1", "GLOO_SOCKET_IFNAME": "eth1"}
    answer = NcclEnvSeen().answer({"non_login": env, "login": env}, recorded)
    assert "HOME=/root" in answer
    assert NcclEnvSeen().process(answer) == {"non_login": env, "login": env}


# -- every other fact in FACTS, each on a real recorded output -------------------------------
#
# The recorded lab node (bench/controller/recorded.json) and the captures in tests/fixtures:
# each test reads the recording, asks the fact for a value that differs from it, and reads the
# answer back with the fact's own ``process``.

RECORDED = json.loads((REPO / "bench" / "controller" / "recorded.json").read_text())["converged"]


def recorded(section: str) -> list[str]:
    texts = {**RECORDED["deploy_state"], **RECORDED["fingerprint"]}
    return texts[section].split("\n")[:-1]


def fixture(path: str) -> dict:
    return json.loads((REPO / "tests" / "fixtures" / path).read_text())


def test_every_fact_in_the_table_answers():
    assert [name for name, (fact, _) in FACTS.items() if not hasattr(fact, "answer")] == []


def test_identity_answers_its_ids_and_gpus_and_keeps_the_recorded_rest():
    lines = recorded("identity")
    value = {
        **Identity().process(lines),
        "boot_id": "boot-node0002",
        "gpus": [{"name": "NVIDIA H100 80GB HBM3", "driver": "580.159.04"}] * 2,
    }
    assert Identity().process(Identity().answer(value, lines)) == value
    partial = Identity().process(Identity().answer({"machine_id": "m2"}, lines))
    assert partial == {**Identity().process(lines), "machine_id": "m2"}


def test_hostname_answers_the_running_and_the_static_name():
    lines = recorded("hostname")
    assert HostnameState().process(lines) == {"running": "node1", "static": "node1"}
    for value in (
        {"running": "node0007", "static": "node0007"},
        {"running": "ip-198-18-0-11", "static": None},
    ):
        assert HostnameState().process(HostnameState().answer(value, lines)) == value


def test_host_keys_answer_the_keys_asked_for_keeping_recorded_comments():
    lines = recorded("host_keys")
    keys = SshHostKeys().process(lines)
    value = [keys[1], "ssh-rsa AAAAB3NzaC1yc2E"]
    answer = SshHostKeys().answer(value, lines)
    assert SshHostKeys().process(answer) == sorted(value)
    assert any(line.endswith(" root@node1") for line in answer)  # the recorded line, kept


def test_mesh_user_answers_its_key_files_blocks_and_certificate():
    fact = SshMeshUser()
    # recorded before the user certificate was read: its answer with no certificate first
    lines = fact.answer({"certificate": None}, recorded("mesh_user:root"))
    old = fact.process(lines)
    assert old["exists"] and old["authorized"]["block"]  # a converged key-mesh node
    certificate = "ssh-ed25519-cert-v01@openssh.com AAAA root@node0001"
    value = {
        "identity": {"mode": "600", "owner": "root", "sha256": "1" * 64},
        "identity_pub": {"mode": "644", "owner": "root", "sha256": "2" * 64},
        "authorized": {"block": ["ssh-ed25519 AAAA trainfleet:c:root@node0001"]},
        "config": {"block": ["Host node0001", "  HostName node0001"]},
        "certificate": certificate,
    }
    new = fact.process(fact.answer(value, lines))
    assert new["identity"] == value["identity"] and new["identity_pub"] == value["identity_pub"]
    assert new["authorized"]["block"] == value["authorized"]["block"]
    assert new["authorized"]["outside"] == old["authorized"]["outside"]
    assert new["config"]["block"] == value["config"]["block"]
    assert new["config"]["text"].startswith(markers(CONFIG_PURPOSE)[0])  # first in the file
    assert new["certificate"] == certificate
    assert {k: new[k] for k in ("home", "uid", "group", "ssh_dir")} == {
        k: old[k] for k in ("home", "uid", "group", "ssh_dir")
    }
    assert fact.process(fact.answer({"exists": False}, lines))["exists"] is False


def test_mesh_proof_answers_the_peers_it_was_asked_for():
    lines = recorded("mesh_proof:root")
    fact = SshMeshProof()
    fact.command(user="root", peers=["node1", "node2", "node3"])
    assert fact.process(lines) == dict.fromkeys(["node1", "node2", "node3"], "ok")
    value = {"node1": "ok", "node2": "rc=255 Host key verification failed.", "node3": "no answer"}
    assert fact.process(fact.answer(value, lines)) == value
    assert fact.process(fact.answer(dict.fromkeys(value, "not probed"), lines)) == dict.fromkeys(
        value, "not probed"
    )
    wide = {"node1": "ok", "node9": "ok"}  # a peer it was not asked for is not printed
    answer = fact.answer(wide, lines)
    assert not any("node9" in line for line in answer)
    assert fact.process(answer) == {"node1": "ok", "node2": "no answer", "node3": "no answer"}


def test_network_answers_its_interfaces_and_ports():
    lines = recorded("network")
    fact = NcclNetwork()
    old = fact.process(lines)
    eth0 = next(i for i in old["interfaces"] if i["name"] == "eth0")
    value = {
        "interfaces": [
            {**eth0, "addresses": ["198.18.4.24"], "cidrs": ["198.18.4.24/16"], "mtu": 9000},
            {"name": "br0", "addresses": [], "bridge": True, "mtu": 1500},
            {"name": "lo", "addresses": ["::1"], "cidrs": ["::1/128"], "bridge": False},
        ],
        "ib_ports": [
            {
                "device": "mlx5_0",
                "port": 1,
                "link_layer": "Ethernet",
                "state": "4:ACTIVE",
                "gids": [{"index": 3, "type": "RoCE_v2", "gid": "0000:ffff", "ndev": "eth0"}],
                "active_mtu": 4096,
            }
        ],
    }
    assert fact.process(fact.answer(value, lines)) == value
    assert fact.process(fact.answer({}, lines)) == old


def test_npus_answer_each_devices_address_in_hccn_conf():
    capture = fixture("npu/facts/atlas_910b_tool_and_hccn_conf.json")
    fact = NpuDeviceIps()
    old = fact.process(capture["output"])
    assert old
    value = {device: f"10.0.0.{device + 1}" for device in old} | {9: "10.0.9.1"}
    answer = fact.answer(value, capture["output"])
    assert fact.process(answer) == value
    assert "conf netmask_0=255.255.0.0" in answer  # the file's other lines kept


@pytest.mark.parametrize(
    "name", ["ubuntu2204_cuda124_converged", "rocky9_cuda124_versionlocked", "centos7_devtoolset11"]
)
def test_stack_answers_the_planned_stack_and_keeps_the_recorded_rest(name):
    capture = fixture(f"stack/facts/{name}.json")
    fact = StackVersions()
    fact.command(**capture["arg"])
    old = fact.process(capture["output"])
    assert fact.process(fact.answer(old, capture["output"])) == old
    packages = {**old["packages"], "libnccl2": "2.23.4-1+cuda12.6"}
    value = {
        **old,
        "packages": packages,
        "held": sorted(packages),
        "nvcc": {"path": "/usr/local/cuda/bin/nvcc", "release": "12.6", "version": "12.6.85"},
        "venv": True,
        "venv_packages": {**old["venv_packages"], "torch": "2.5.1+cu126"},
        "torch": {
            "version": "2.5.1+cu126",
            "cuda": "12.6",
            "gpu": True,
            "cudnn": 90100,
            "nccl": "2.21.5",
        },
        "gcc": None,
        "repos": {**old["repos"], "/etc/apt/sources.list.d/cuda-x.list": "deb [a] b /\n"},
        "gcc_profile": "source /opt/rh/gcc-toolset-12/enable\n",
        "busy": {"venv": [4242], "gpu": [], "unknown": ["gpu"]},
    }
    assert fact.process(fact.answer(value, capture["output"])) == value
    # the capability's converged value names only some of nvcc's and torch's fields
    partial = fact.process(fact.answer({"nvcc": {"release": "12.6"}}, capture["output"]))
    assert partial["nvcc"]["release"] == "12.6" and partial["packages"] == old["packages"]


@pytest.mark.parametrize(
    "name", ["hgx_a100_converged", "cpu_node_chrony_7s_slow", "pcie_rtx4000_timesyncd_1s_slow"]
)
def test_gpu_node_answers_its_settings_and_keeps_the_recorded_rest(name):
    capture = fixture(f"gpu_node/facts/{name}.json")
    fact = GpuNodeState()
    old = fact.process(capture["output"])
    assert old == capture["fact"]
    unchanged = fact.answer(old, capture["output"])  # every part as recorded, line for line
    assert sorted(unchanged) == sorted(capture["output"])
    value = {
        **old,
        "smi": "ok",
        "driver": "580.159.04",
        "gpus": [
            {
                "bus": "00000000:18:00.0",
                "persistence": "Enabled",
                "fabric_state": "Completed",
                "fabric_status": "Success",
            },
            {
                "bus": "00000000:2a:00.0",
                "persistence": "Disabled",
                "fabric_state": None,
                "fabric_status": None,
            },
        ],
        "nvswitches": ["0000:05:00.0"],
        "systemd": True,
        "units": {"nvidia-persistenced": {"enabled": "enabled", "active": "active"}},
        "fabricmanager": {"nvidia-fabricmanager-580": "580.159.04-1"},
        "fabricmanager_held": ["nvidia-fabricmanager-580"],
        "peermem_loaded": True,
        "peermem_boot": ["/etc/modules-load.d/trainfleet-peermem.conf"],
        "memlock": "unlimited",
        "memlock_hard": "unlimited",
        "memlock_conf": "* soft memlock unlimited\n",
        "memlock_other": ["/etc/security/limits.conf: * hard memlock 64"],
        "peermem_conf": "nvidia_peermem\n",
        "clock": {"chrony": True, "offset_ms": -7.5, "leap": "Normal", "ntp_synchronized": "yes"},
    }
    assert fact.process(fact.answer(value, capture["output"])) == value
    timesync = {"chrony": False, "offset_ms": 1.25, "leap": None, "ntp_synchronized": "no"}
    answer = fact.answer({"clock": timesync, "smi": "failed (exit 124)"}, capture["output"])
    assert fact.process(answer) == {
        **old,
        "clock": timesync,
        "smi": "failed (exit 124)",
        "driver": None,
        "gpus": [],
    }


def test_hardware_answers_what_its_recorded_sources_can_say():
    output = (REPO / "tests/fixtures/hardware/h100_capture/hardware-check.out").read_text()
    lines = output.split("\n")[:-1] if output.endswith("\n") else output.split("\n")
    fact = HardwareState()
    old = fact.process(lines)
    assert old["gpus"] and old["cpu_hypervisor"] is True  # a lent H100 VM
    status = {**old["status"], "dmesg.txt": "skipped", "nvidia-smi-topo-m.txt": "exit 124"}
    value = {
        **old,
        "status": status,
        "problems": {**old["problems"], "dmesg.txt": "skipped"},  # topo -m is read elsewhere
        "kernel": None,
        "iommu": ["intel_iommu=on", "iommu=pt"],
        "cpu_hypervisor": False,
    }
    assert fact.process(fact.answer(value, lines)) == value
    with pytest.raises(ValueError, match="gpus"):  # the capture's GPU cannot be answered away
        fact.answer({"gpus": []}, lines)
