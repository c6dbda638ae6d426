"""A node user is an adversary: alice, a second mesh user, plays every attack of issue #13 on
the lab's real nodes while root deploys. After two deploys nothing outside alice's own files
changed owner, mode or content, and root still logs in everywhere."""

from __future__ import annotations

import pytest

from facts.managed_block_facts import USER_PATH
from tests.lab.harness import fact, pyinfra

DEPLOY = "deploy/cluster.py"
# node3's root: its login carries a variable (bash reads ~/.bashrc for an ssh command, so every
# command pyinfra runs there has it) and its ssh config is a link into its own dotfiles.
ROOT_ENV = "TF_ROOT_ONLY"
ROOTS_NODE3 = (
    f"sed -i '1i export {ROOT_ENV}=root-env-marker' /root/.bashrc && "
    "mkdir -m 700 /root/dotfiles && "
    "{ [ -f /root/.ssh/config ] && mv /root/.ssh/config /root/dotfiles/ssh_config || "
    "  printf 'Host *\\n    ServerAliveInterval 60\\n' > /root/dotfiles/ssh_config; } && "
    "chmod 600 /root/dotfiles/ssh_config && ln -s ../dotfiles/ssh_config /root/.ssh/config"
)
ALICE = "su -s /bin/sh alice -c "
# What alice must never get at: root's SSH directory, the password hashes, a host key.
GUARDED = (
    "/root /root/.ssh /root/.ssh/authorized_keys /etc/shadow /etc/passwd "
    "/etc/ssh/ssh_host_ed25519_key"
)
SNAPSHOT = (
    f"for f in {GUARDED}; do printf '%s ' \"$f\"; stat -c '%U:%G %a' \"$f\"; done; "
    "sha256sum /etc/shadow /etc/passwd /etc/ssh/ssh_host_ed25519_key; "
    # everything alice owns outside her home (the places root writes)
    "find /root /etc /run /opt -xdev -user alice 2>/dev/null"
)


def as_alice(lab, node: str, script: str) -> str:
    return lab.ssh(node, ALICE + _q(script))


def _q(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


@pytest.fixture()
def hostile(lab3, tmp_path):
    """A fresh 3-node lab where alice exists on every node and is a mesh user."""
    for node in ("node1", "node2", "node3"):
        lab3.ssh(node, "useradd -m -s /bin/sh alice")
    inventory = lab3.spec_inventory(tmp_path, cluster={"mesh_users": ["root", "alice"]})
    return lab3, inventory


def test_alices_links_and_planted_files_give_her_nothing_of_roots(hostile):
    lab, inventory = hostile
    # node1: her MCA parameter file is a link to /etc/passwd (the deploy writes it).
    as_alice(lab, "node1", "mkdir -p ~/.openmpi && ln -s /etc/passwd ~/.openmpi/mca-params.conf")
    # node2: her ~/.ssh is a link to root's (the deploy "fixed" its mode and owner).
    as_alice(lab, "node2", "ln -s /root/.ssh ~/.ssh")
    # node3: the old fixed temp name of the key upload planted as a link to /etc/shadow, and a
    # dotfiles habit that must keep working: ~/.ssh/config is a link into her own dotfiles
    # (whose `Match exec` records the environment every ssh of hers runs with); root has
    # the same habit.
    as_alice(
        lab,
        "node3",
        "mkdir -m 700 ~/.ssh ~/dotfiles && ln -s /etc/shadow ~/.ssh/id_trainfleet.trainfleet-new"
        ' && printf \'Match exec "env > ~/ssh-env; false"\\nHost *\\n    ServerAliveInterval '
        "30\\n'"
        " > ~/dotfiles/ssh_config && ln -s ~/dotfiles/ssh_config ~/.ssh/config",
    )
    lab.ssh("node3", ROOTS_NODE3)
    before = {node: lab.ssh(node, SNAPSHOT) for node in ("node1", "node2", "node3")}

    first = pyinfra(inventory, DEPLOY)
    second = pyinfra(inventory, DEPLOY)

    for run in (first, second):
        assert run.returncode != 0, run.describe()
        failed = {host for hosts in run.errors().values() for host in hosts}
        assert failed == {"node1", "node2"}, run.errors()
        # Each fails where alice's link meets alice's own privileges (pyinfra then counts the
        # node's later operations as failed too); node3 and root's steps go on.
        # On node2 her first step fails (ignored there, #38 review 1): her later steps wait,
        # none of node2's root-owned steps does; node2 is failed in the mesh's last step, naming
        # alice and her step.
        assert run.errors()["alice also trusts the mesh's new lines"] == ["node2"]
        assert "SSH mesh for alice" not in run.errors()
        assert run.errors()["The mesh steps in the homes of alice ran"] == ["node2"]
        assert (
            '[node2] trainfleet: alice: the step "alice also trusts the mesh\'s new lines" '
            "failed in their home" in run.stderr
        )
        assert "node1" in run.errors()["OpenMPI network (~/.openmpi/mca-params.conf)"]
        assert "SSH mesh for root" not in run.errors()
        assert (
            "[node1] trainfleet: /etc/passwd: cannot make a temp file in /etc; nothing was changed"
            in run.stderr
        )
        # (her writer runs with LANG=C.UTF-8: coreutils quotes in Unicode)
        assert "[node2] mkdir: cannot stat ‘/home/alice/.ssh’: Permission denied" in run.stderr
    assert not {op: hosts for op, hosts in second.changed().items() if "node3" in hosts}, (
        second.changed()
    )
    for node in ("node1", "node2", "node3"):
        assert lab.ssh(node, SNAPSHOT) == before[node], f"{node}: something of root's changed"
        assert lab.ssh(node, "true") == ""  # root still logs in
    # The dotfiles link stays a link; its target, hers, holds the block above her lines.
    node3 = lab.host("node3")
    her_link = node3.file("/home/alice/.ssh/config")
    assert her_link.is_symlink and her_link.linked_to == "/home/alice/dotfiles/ssh_config"
    config = node3.file("/home/alice/dotfiles/ssh_config").content_string
    assert config.startswith("# BEGIN trainfleet managed block: ssh mesh hosts")
    assert config.endswith("Host *\n    ServerAliveInterval 30\n")
    # Her mesh works on node3: she reaches node3 itself by name with the cluster key.
    assert (
        lab.ssh("node3", ALICE + _q("ssh -o BatchMode=yes node3 true && echo mesh-ok"))
        == "mesh-ok\n"
    )
    # Root's dotfiles link too stays a link; its target, root's, holds the block above root's lines.
    roots_link, roots_config = (
        node3.file("/root/.ssh/config"),
        node3.file("/root/dotfiles/ssh_config"),
    )
    assert roots_link.is_symlink and roots_link.linked_to == roots_config.path
    assert (roots_config.user, roots_config.mode) == ("root", 0o600)
    assert roots_config.content_string.startswith(
        "# BEGIN trainfleet managed block: ssh mesh hosts"
    )

    # The mesh probe as alice (drift's and the preflight's) runs ssh with a fixed environment:
    # nothing of root's, although every command pyinfra runs as root on node3 carries it.
    assert lab.ssh("node3", f"echo ${ROOT_ENV}") == "root-env-marker\n"
    lab.ssh("node3", "rm -f /home/alice/ssh-env")
    assert fact(inventory, "facts.ssh_mesh_facts.SshMeshProof", "user=alice", "peers=node3")[
        "node3"
    ] == {"node3": "ok"}
    seen = dict(
        line.split("=", 1)
        for line in node3.file("/home/alice/ssh-env").content_string.splitlines()
        if "=" in line
    )
    assert ROOT_ENV not in seen and seen["PATH"] == USER_PATH and seen["HOME"] == "/home/alice", (
        seen
    )

    # Root's link into a directory alice can change is refused, naming the file, untouched.
    as_alice(lab, "node3", "printf 'Host *\\n' > ~/theirs")
    lab.ssh("node3", "ln -sfn /home/alice/theirs /root/.ssh/config")
    refused = pyinfra(inventory, DEPLOY, limit="node3")
    assert refused.returncode != 0, refused.describe()  # node3 was the only host: no --json report
    assert (
        "[node3] trainfleet: /root/.ssh/config: is a symbolic link through /home/alice, which is "
        "not root's alone" in refused.stderr
    ), refused.describe()
    assert node3.file("/home/alice/theirs").content_string == "Host *\n"
    assert roots_link.is_symlink and roots_link.linked_to == "/home/alice/theirs"


def test_a_race_on_the_temp_files_in_her_home_gives_her_nothing(hostile):
    lab, inventory = hostile
    before = lab.ssh("node3", SNAPSHOT)
    # For the length of two deploys (bounded in count and by timeout), replace every temp file
    # trainfleet makes in her directories with a link to /etc/shadow, as fast as she can. (temp
    # names of today's writer, .trainfleet.XXXXXX, and of earlier ones, FILE.trainfleet.XXXXXX)
    swap = (
        "mkdir -p ~/.ssh ~/.openmpi; i=0; while [ $i -lt 3000000 ]; do i=$((i + 1)); "
        "for f in ~/.ssh/.trainfleet.* ~/.openmpi/.trainfleet.* "
        "~/.ssh/*.trainfleet.* ~/.openmpi/*.trainfleet.*; do "
        '[ -f "$f" ] && [ ! -L "$f" ] && rm -f "$f" && ln -s /etc/shadow "$f" && '
        'echo "$f" >> ~/swapped; '
        "done; done"
    )
    pid = lab.ssh(
        "node3", ALICE + _q(f"nohup timeout 60 sh -c {_q(swap)} >/dev/null 2>&1 & echo $!")
    ).strip()
    assert pid.isdigit()
    try:
        for _ in range(2):
            pyinfra(inventory, DEPLOY)  # her own files may fail to converge; that is her doing
    finally:
        lab.ssh("node3", f"kill {pid} 2>/dev/null; true")
    swapped = lab.ssh("node3", "cat /home/alice/swapped 2>/dev/null || true").split()
    assert lab.ssh("node3", SNAPSHOT) == before, f"root's files changed; alice swapped {swapped}"
    assert lab.ssh("node3", "true") == ""
