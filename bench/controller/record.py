"""``python -m bench.controller record``: what a lab node answers to trainfleet's fact commands.

As root, under the lab lock: a fresh 3-node lab; node1's answer to the ``DeployState``
command (a freshly booted node, before any deploy); then ``deploy/cluster.py`` on the lab, a
second run that must change nothing (so what follows is converged), and node1's answers to
``DeployState`` and ``NodeFingerprint``. Each answer is stored decoded, section by section, in
``recorded.json`` with where, when and how it was taken. The lab is always taken down again.
"""

from __future__ import annotations

import base64
import datetime
import fcntl
import json
import os
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from bench.lab_report import source
from bench.run import PYINFRA, REPO, parse_results

RECORDED = Path(__file__).with_name("recorded.json")
LAB_LOCK = (
    "/tmp/trainfleet-lab.lock"  # the lock every session's lab use holds (flock(1) on the same file)
)
LAB_NODES = 3
NODE = "node1"
MARK = "--trainfleet-fingerprint--"


def bundle_command(kind: str, users: list[str], peers: list[str]) -> str:
    """The exact shell text pyinfra sends for a bundle (``deploy_state`` | ``fingerprint``)."""
    from runtime.bundle import DeployState, NodeFingerprint

    command = (
        DeployState().command(users=users)
        if kind == "deploy_state"
        else NodeFingerprint().command(users=users, peers=peers)
    )
    return command.get_raw_value()


def decode_bundle(stdout: str) -> dict[str, str]:
    """{section: its output's text} from a bundle's raw stdout (one base64 line per section).
    Bytes that are not UTF-8 survive as surrogate escapes (as facts/managed_block.decode_lines)."""
    sections: dict[str, str] = {}
    lines = stdout.split("\n")
    for at, line in enumerate(lines):
        if line.startswith(MARK + " "):
            encoded = lines[at + 1] if at + 1 < len(lines) else ""
            sections[line.split(" ", 1)[1]] = base64.b64decode(encoded, validate=True).decode(
                "utf-8", "surrogateescape"
            )
    return sections


def _ssh(lab: Any, node: str, command: str) -> str:
    """Run ``command`` on a lab node as pyinfra's ssh connector does (``sh -c``, no tty)."""
    address = lab.node(node).address
    argv = [
        "ssh",
        *lab.ssh_options(),
        f"root@{address}",
        "sh -c " + shlex.quote(command),
    ]
    result = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        errors="surrogateescape",
        timeout=300,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"{node}: the bundle command exited {result.returncode}: {result.stderr[-2000:]}"
        )
    return result.stdout


def _deploy(env: dict[str, str]) -> tuple[int, int | None, int | None, str]:
    proc = subprocess.run(
        [PYINFRA, "-y", "--json", "inventories/lab.py", "deploy/cluster.py"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    changed, errors = parse_results(proc.stdout)
    return proc.returncode, changed, errors, proc.stderr[-3000:]


def record(out: Path = RECORDED, log: Any = print) -> dict[str, Any]:
    """Take the recording (needs root and the lab); write and return it."""
    from lab.netns import Lab

    if os.geteuid() != 0:
        raise SystemExit("record: the lab needs root")
    with open(LAB_LOCK, "a") as lock:
        log(f"record: waiting for {LAB_LOCK}")
        fcntl.flock(lock, fcntl.LOCK_EX)  # the lock `flock /tmp/trainfleet-lab.lock CMD` takes
        lab = Lab()
        if lab.is_up():
            raise SystemExit(
                "record: a lab is up although nobody holds the lab lock; take it down "
                "(`python -m lab down`) if it is yours"
            )
        try:
            return _record(lab, out, log)
        finally:
            left = lab.down(log=log)
            netns = subprocess.run(
                ["ip", "netns", "list"], capture_output=True, text=True, check=False
            ).stdout
            if left or "tflab-" in netns:
                log(f"record: the lab left this behind: {left} {netns}")


def _record(lab: Any, out: Path, log: Any) -> dict[str, Any]:
    import yaml

    lab.up(LAB_NODES, log=log)
    spec = yaml.safe_load(lab.spec.read_text())
    users = spec["cluster"]["mesh_users"]
    peers = [n["name"] for n in spec["nodes"]]
    fresh = decode_bundle(_ssh(lab, NODE, bundle_command("deploy_state", users, peers)))
    with tempfile.TemporaryDirectory(prefix="trainfleet-record-") as home:
        env = {**os.environ, "TRAINFLEET_HOME": home, "PYINFRA_PROGRESS": "off"}
        runs = []
        for attempt in ("first provision", "re-run"):
            code, changed, errors, stderr = _deploy(env)
            log(f"record: {attempt}: exit {code}, changed {changed}, errors {errors}")
            runs.append({"run": attempt, "exit": code, "changed": changed, "errors": errors})
            if code != 0 or errors:
                raise RuntimeError(
                    f"record: {attempt} of deploy/cluster.py failed (exit {code}): {stderr}"
                )
        if runs[-1]["changed"]:
            raise RuntimeError(
                f"record: the re-run changed {runs[-1]['changed']} host-operations: not converged"
            )
    converged = decode_bundle(_ssh(lab, NODE, bundle_command("deploy_state", users, peers)))
    fingerprint = decode_bundle(_ssh(lab, NODE, bundle_command("fingerprint", users, peers)))
    node = lab.node(NODE)
    identity = dict(
        line.split(" ", 1) for line in fingerprint["identity"].splitlines() if " " in line
    )
    document = {
        "header": {
            "what": (
                "node1's answers to trainfleet's one-command fact bundles, decoded section by "
                "section: fresh = DeployState of a freshly booted lab node before any deploy; "
                "converged = DeployState and NodeFingerprint after deploy/cluster.py and a re-run "
                "that changed nothing"
            ),
            "how": "python -m bench.controller record (bench/controller/record.py)",
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "lab": {
                "nodes": LAB_NODES,
                "node": NODE,
                "address": node.address,
                "peers": peers,
                "decoy": True,
                "spec": spec,
            },
            "kernel": identity.get("kernel", "").strip(),
            "os": identity.get("os", "").strip(),
            "source": source(REPO),
            "deploy_runs": runs,
        },
        "fresh": {"deploy_state": fresh},
        "converged": {"deploy_state": converged, "fingerprint": fingerprint},
    }
    out.write_text(json.dumps(document, indent=1) + "\n")
    log(f"record: wrote {out}")
    return document


def load(path: Path = RECORDED) -> dict[str, Any]:
    if not path.exists():
        raise SystemExit(
            f"{path} is missing: record it first (as root: python -m bench.controller record)"
        )
    return json.loads(path.read_text())
