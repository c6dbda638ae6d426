"""Each fact's ``answer``: what a converged node prints, read back by the fact's own
``process``, is the value it was made from (the controller benchmark derives its nodes'
answers from the capabilities' ``converged`` through these)."""

from __future__ import annotations

from facts.hosts_facts import HOSTS_PURPOSE
from facts.launchers_facts import LauncherFiles
from facts.managed_block_facts import ManagedBlock, encode_lines, file_line
from facts.nccl_env_facts import NcclEnvFiles, NcclEnvSeen
from facts.openmpi_facts import MCA_PURPOSE, OpenMpiState
from facts.pdsh_facts import PdshState
from facts.ssh_mesh_facts import _HOST_CERT_PATHS, SshdMesh
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
