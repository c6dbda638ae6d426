"""Two controllers deploy the same fresh cluster at the same moment: every write holds the
node's lock and replaces a file only if it still has the bytes its run read, so each managed
file ends with exactly one intact block, whichever run won, and nothing is lost."""

from __future__ import annotations

import json
import subprocess

from tests.lab.harness import LAB_INVENTORY, PYINFRA, REPO, deploy_twice

DEPLOY = "deploy/cluster.py"
FILES = [
    "/etc/hosts",
    "/etc/ssh/ssh_known_hosts",
    "/root/.ssh/authorized_keys",
    "/root/.ssh/config",
    "/etc/environment",
    "/etc/genders",
]


def test_two_deploys_at_once_leave_every_block_whole_and_lose_no_line(lab3):
    for node in ("node1", "node2", "node3"):
        lab3.ssh(node, "echo '10.9.9.9 nas  # the site admin' >> /etc/hosts")
    runs = [
        subprocess.Popen(
            [PYINFRA, "-y", "--json", LAB_INVENTORY, DEPLOY],
            cwd=REPO,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=300) for run in runs]

    # Each run either converged or failed a node cleanly ("changed after it was read" or the
    # lock); none crashed without its --json report.
    for run, (stdout, stderr) in zip(runs, outputs, strict=False):
        if run.returncode == 0:
            json.loads(stdout[stdout.find("{") :])
            continue
        # (when every node failed pyinfra ends with "No hosts remaining" and prints no JSON)
        reasons = [line for line in stderr.splitlines() if "trainfleet:" in line]
        assert reasons, stderr[-3000:]
        assert all(
            "changed after it was read" in line
            or "holds this node's lock" in line
            or "appeared after it was read" in line
            for line in reasons
        ), reasons
    for node in ("node1", "node2", "node3"):
        files = lab3.read(node, FILES)
        for path, text in files.items():
            assert text is not None, f"{node}:{path} missing"
            assert text.count("# BEGIN trainfleet managed block") == 1, f"{node}:{path}\n{text}"
            assert text.count("# END trainfleet managed block") == 1, f"{node}:{path}\n{text}"
        assert "10.9.9.9 nas  # the site admin\n" in files["/etc/hosts"]
        assert (
            files["/etc/ssh/ssh_known_hosts"].count("@cert-authority ") == 1
        )  # the certificate mesh's one line
    deploy_twice(LAB_INVENTORY, DEPLOY)
