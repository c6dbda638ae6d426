"""Driving the lab and pyinfra from tests: real nodes, real SSH, pyinfra's own --json results."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import testinfra
import yaml

from lab.lab_stack import launch_stack
from lab.netns import Lab

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
LAB_INVENTORY = str(REPO / "inventories/lab.py")
TORCH_STACK = (
    launch_stack()
)  # torch, accelerate, DeepSpeed, OpenMPI: one install shared by every torch test


@dataclass
class Run:
    """One pyinfra run: exit status, output, and the parsed --json report."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    parsed: dict[str, Any] | None = None  # the --json report; None: none could be read
    json_error: str = ""

    @property
    def report(self) -> dict[str, Any]:
        """The --json report; a run that printed none (it crashed) fails the test here, it
        never reads as a run that changed nothing."""
        assert self.parsed is not None, f"no --json report ({self.json_error})\n{self.describe()}"
        return self.parsed

    @property
    def operations(self) -> list[dict[str, Any]]:
        return (self.report.get("results") or {}).get("operations", [])

    def changed(self) -> dict[str, list[str]]:
        """Operation name -> hosts it changed."""
        return {op["name"]: op["success"] for op in self.operations if op["success"]}

    def errors(self) -> dict[str, list[str]]:
        return {op["name"]: op["error"] for op in self.operations if op["error"]}

    def planned_changes(self) -> dict[str, list[str]]:
        """With --dry: operation name -> hosts pyinfra would change."""
        return {
            op["name"]: op["hosts_with_change"]
            for op in self.report.get("plan", [])
            if op["hosts_with_change"]
        }

    def describe(self) -> str:
        return f"$ {' '.join(self.argv)}\nexit {self.returncode}\n{self.stderr[-4000:]}"


def pyinfra(
    inventory: str,
    *deploys: str,
    dry: bool = False,
    timeout: int = 300,
    data: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    limit: str | None = None,
) -> Run:
    extra = [arg for key, value in (data or {}).items() for arg in ("--data", f"{key}={value}")]
    extra += ["--limit", limit] if limit else []
    # --dry without -y: pyinfra's -y turns change-checking off, so a dry run with it plans
    # no change whatever the nodes hold (a dry run never prompts, so no -y is needed).
    argv = [PYINFRA, *(["--dry"] if dry else ["-y"]), "--json", *extra, inventory, *deploys]
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
        env={**os.environ, **env} if env else None,
    )
    report: dict[str, Any] | None = None
    error = "no JSON in the output"
    start = proc.stdout.find("{")
    if start >= 0:
        try:
            report = json.loads(proc.stdout[start:])
        except json.JSONDecodeError as exc:
            error = f"unreadable JSON: {exc}"
    return Run(argv, proc.returncode, proc.stdout, proc.stderr, report, error)


def fact(inventory: str, fact_name: str, *args: str) -> dict[str, Any]:
    """``pyinfra INVENTORY fact NAME ARGS --json``: {host: value}."""
    proc = subprocess.run(
        [PYINFRA, "--json", inventory, "fact", fact_name, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    (values,) = json.loads(proc.stdout).values()
    return values


def deploy_twice(
    inventory: str, deploy: str, data: dict[str, str] | None = None
) -> tuple[Run, Run]:
    """Run a deploy, then again: the second run must change nothing (the idempotency property)."""
    first = pyinfra(inventory, deploy, data=data)
    assert first.returncode == 0, first.describe()
    second = pyinfra(inventory, deploy, data=data)
    assert second.returncode == 0, second.describe()
    assert second.changed() == {}, f"re-run changed {second.changed()}\n{second.describe()}"
    assert second.operations, "the re-run reported no operations at all"
    return first, second


def readmit(lab: LabController, *nodes: str) -> None:
    """The operator's word that nodes put back in the spec may present the host keys they had
    when they left it (``keys readmit``): revoked host keys come back only this way, and only
    those the lab's known_hosts (the controller's) lists for them."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "trainfleet",
            "keys",
            "readmit",
            str(lab.lab.spec),
            *nodes,
            "--known-hosts",
        ],
        check=True,
        cwd=REPO,
        capture_output=True,
    )


def on_every_node(
    lab: LabController, nodes: list[str], command: str, timeout: int = 300
) -> dict[str, str]:
    """Run ``command`` on the nodes at once (installs take a while); {node: stdout}."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(nodes)) as pool:
        return dict(
            zip(
                nodes, pool.map(lambda n: lab.ssh(n, command, timeout=timeout), nodes), strict=False
            )
        )


class LabController:
    """The test session's own lab: created and torn down by the tests."""

    def __init__(self) -> None:
        self.lab = Lab()
        self.prepared: str | None = None  # what the current lab was prepared for, if shared

    def fresh(self, count: int, decoy: bool = True) -> None:
        self.lab.down(log=lambda *_: None)
        self.lab.up(count, log=lambda *_: None, decoy=decoy)
        self.prepared = None

    def down(self) -> dict[str, list[str]]:
        return self.lab.down(log=lambda *_: None)

    def ssh(
        self,
        node: str,
        command: str,
        check: bool = True,
        input: str | None = None,
        timeout: int = 60,
        user: str = "root",
    ) -> str:
        """Run ``command`` on ``node`` over real SSH, as ``python -m lab ssh`` does; return
        stdout."""
        address = self.lab.node(node).address
        argv = ["ssh", *self.lab.ssh_options(), f"{user}@{address}", command]
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input if input is not None else "",
        )
        if check:
            assert result.returncode == 0, f"{node}: {command}: {result.stderr}"
        return result.stdout

    def host(self, node: str, user: str = "root") -> testinfra.host.Host:
        """``node`` as testinfra sees it, over the same SSH as ``ssh``, with no master
        connection left behind (ControlPersist off). Tests read node state through its modules:
        ``host.file(path)``, ``host.package(name)``, ``host.process``, ``host.user()``."""
        return testinfra.get_host(
            f"ssh://{user}@{self.lab.node(node).address}",
            ssh_extra_args=shlex.join(self.lab.ssh_options()),
            controlpersist=0,
        )

    def wait_for_login(self, node: str, timeout: float = 30.0) -> None:
        """Until ``node``'s sshd lets the operator in with the host key the lab's known_hosts
        now lists (after a restart or a new host key): the event itself, not a fixed sleep."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.ssh(node, "true", timeout=10)
                return
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def copy_tree(self, node: str, local: Path, remote: str) -> None:
        """Copy a local directory's contents to ``remote`` on ``node`` (tar over the same SSH)."""
        address = self.lab.node(node).address
        tar = subprocess.Popen(["tar", "-C", str(local), "-cf", "-", "."], stdout=subprocess.PIPE)
        argv = [
            "ssh",
            *self.lab.ssh_options(),
            f"root@{address}",
            f"mkdir -p '{remote}' && tar -C '{remote}' -xf -",
        ]
        result = subprocess.run(argv, stdin=tar.stdout, capture_output=True, timeout=120)
        tar.wait()
        assert tar.returncode == 0 and result.returncode == 0, (
            f"{node}: copy to {remote}: {result.stderr!r}"
        )

    def read(self, node: str, paths: list[str]) -> dict[str, str | None]:
        """Several files of a node, through testinfra: {path: content, or None if missing}."""
        files = {path: self.host(node).file(path) for path in paths}
        return {path: file.content_string if file.exists else None for path, file in files.items()}

    def spec_inventory(
        self,
        tmp_path: Path,
        keep: list[str] | None = None,
        node_settings: dict[str, dict] | None = None,
        **sections: dict,
    ) -> str:
        """An inventory for a variant of the lab's spec: only the ``keep`` nodes, per-node
        settings and top-level sections merged in."""
        spec = yaml.safe_load(self.lab.spec.read_text())
        if keep is not None:
            spec["nodes"] = [n for n in spec["nodes"] if n["name"] in keep]
        for node in spec["nodes"]:
            node.update((node_settings or {}).get(node["name"], {}))
        for name, values in sections.items():
            spec.setdefault(name, {}).update(values)
        spec_file = tmp_path / "variant.yml"
        spec_file.write_text(yaml.safe_dump(spec, sort_keys=False))
        inventory = tmp_path / "variant.py"
        inventory.write_text(
            textwrap.dedent(f"""\
            from runtime.inventory import load_cluster_or_exit, pyinfra_hosts
            nodes = pyinfra_hosts(load_cluster_or_exit({str(spec_file)!r}))
            """)
        )
        return str(inventory)


def front_door(*args: str) -> subprocess.CompletedProcess[str]:
    """``trainfleet ARGS`` as a user runs it, from elsewhere (the front door finds deploy/
    itself); drift's JSON report on stdout too."""
    return subprocess.run(
        [sys.executable, "-m", "trainfleet", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
        env={**os.environ, "TRAINFLEET_DRIFT_JSON": "-"},
    )


def adopted_spec(spec: Path, folder: Path) -> Path:
    """The lab's spec, adopting the nodes with their own hostnames
    (``manage: {hostname: false}``), written in ``folder``."""
    adopted = yaml.safe_load(spec.read_text())
    adopted["manage"] = {"hostname": False}
    path = folder / "adopted.yml"
    path.write_text(yaml.safe_dump(adopted, sort_keys=False))
    return path
