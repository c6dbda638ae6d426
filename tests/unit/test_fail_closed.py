"""Checks that saw nothing, or could not read what a node said, fail; they never pass."""

from __future__ import annotations

import base64

import pytest
from pyinfra.api.exceptions import FactProcessError

from facts.fingerprint import FactBundle
from facts.hosts_facts import HOSTS_PURPOSE
from facts.managed_block_facts import ManagedBlock
from facts.ssh_mesh_facts import SshMeshProof, SshMeshUser

PEERS = ["node1", "node2", "node3"]


def proof(output: list[str]) -> dict[str, str]:
    fact = SshMeshProof()
    fact.command(user="root", peers=PEERS)
    return fact.process(output)


def test_a_probe_that_printed_nothing_proves_nothing():
    assert proof([]) == {peer: "not probed" for peer in PEERS}
    # su failed, or the user's shell printed something else: no "probing" line, no proof.
    assert proof(["ok node1", "ok node2", "ok node3"]) == {peer: "not probed" for peer in PEERS}


def test_a_peer_that_did_not_answer_is_named_and_made_up_peers_are_ignored():
    result = proof(
        ["probing 3", "ok node1", "fail node2 rc=255 Host key verification failed.", "ok evil"]
    )
    assert result == {
        "node1": "ok",
        "node2": "rc=255 Host key verification failed.",
        "node3": "no answer",
    }


class _Hosts(FactBundle):
    def parts(self):  # type: ignore[override]
        return {"hosts": (ManagedBlock, {"path": "/etc/hosts", "purpose": HOSTS_PURPOSE})}


def _bundle_output(section_lines: list[str]) -> tuple[FactBundle, list[str]]:
    bundle = _Hosts()
    bundle.command()
    return bundle, ["--trainfleet-fingerprint-- hosts", *section_lines]


@pytest.mark.parametrize(
    "section",
    [
        [],  # the section is missing its line
        ["not base64 !!"],
        [
            base64.b64encode(b"file /etc/hosts regular - %%%\n").decode()
        ],  # a file line that does not decode
        [base64.b64encode(b"garbage\n").decode()],  # no file line at all
    ],
)
def test_output_a_node_returns_that_cannot_be_read_fails_that_node_only(section):
    bundle, output = _bundle_output(section)
    with pytest.raises(FactProcessError):  # pyinfra fails that host; the other nodes go on
        bundle.process(output)


def test_a_mesh_users_files_that_could_not_be_read_as_the_user_fail_the_node():
    fact = SshMeshUser()
    with pytest.raises(FactProcessError):
        fact.process(
            ["home /home/alice", "uid 1001", "group alice", "user "]
        )  # setpriv printed nothing
