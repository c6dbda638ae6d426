"""Bring a namespace lab up, take it down, and report on it.

Naming is the contract that makes teardown complete even after a crash: every
network namespace and veth is ``tflab-<node>``, the bridge is ``tflab0``, and
everything on disk lives under the state dir. ``down`` finds leftovers by those
names, not only through the state file.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import socket
import stat
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from lab.image import ensure_image, install_image, mkdirs_like_host

STATE_DIR = Path(os.environ.get("TRAINFLEET_LAB_DIR", "/var/lib/trainfleet-lab"))
BRIDGE = "tflab0"
# A second lab runs beside the first only in its own controller namespace (tests/run_suite.py),
# under its own state dir and prefix: namespace names are global to the machine.
PREFIX = os.environ.get("TRAINFLEET_LAB_PREFIX", "tflab-")
if not re.fullmatch(r"[a-z][a-z0-9]{0,6}-", PREFIX):  # a veth name is at most 15 characters
    raise SystemExit(f"TRAINFLEET_LAB_PREFIX={PREFIX!r}: 1-7 lowercase letters/digits, then '-'")
SUBNET = "198.18.0"
BRIDGE_ADDRESS = f"{SUBNET}.1"
FIRST_HOST = 11
MAX_NODES = 32
BOOT_SCRIPT = Path(__file__).with_name("boot.sh")
ROOT_DOTFILES = Path("/usr/share/base-files")  # root's .bashrc and .profile on Debian
REQUIRED_COMMANDS = (
    "ip",
    "unshare",
    "chroot",
    "ssh-keygen",
    "ssh",
    "/usr/sbin/sshd",
    "/usr/bin/tini",
)
SSH_WAIT_SECONDS = 30.0
# Each node's decoy NIC: eno1 at 198.18.0.(128 + host)/25, a subnet that is a dead end on
# every node (its route points at the node's own dead-end veth), so peers cannot reach it.
DECOY_NIC = "eno1"
DECOY_OFFSET = 128
# Rails (`up N --rails R`): rail r (1..R) is eth<r> in every node, at 198.18.(10 + r).<host>/24,
# a veth into a bridge of its own (<prefix>rail<r>): a separate network per rail, as on a
# rail-optimised fabric, so a pair over rail r reaches its partner's rail r and nothing else.
MAX_RAILS = 8
RAIL_SUBNET_BASE = 10


def rail_interface(rail: int) -> str:
    return f"eth{rail}"


def rail_bridge(rail: int) -> str:
    return f"{PREFIX}rail{rail}"


class LabError(Exception):
    """Something the user must act on; the message says what."""


@dataclass
class LabNode:
    name: str
    address: str
    netns: str
    pid: int = 0

    @property
    def dir(self) -> Path:
        return STATE_DIR / "nodes" / self.name


def node_for(index: int) -> LabNode:
    name = f"node{index}"
    return LabNode(name=name, address=f"{SUBNET}.{FIRST_HOST + index - 1}", netns=PREFIX + name)


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise LabError(
            f"`{' '.join(args)}` failed: {result.stderr.strip() or result.stdout.strip()}"
        )
    return result


def _whiteout(path: Path) -> None:
    """Hide a lower-layer file in the node (an overlayfs whiteout is a 0/0 char device)."""
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mknod(path, stat.S_IFCHR | 0o000, os.makedev(0, 0))


class Lab:
    """The lab on this machine, described by the state dir."""

    def __init__(self, state_dir: Path = STATE_DIR):
        self.state_dir = state_dir
        self.state_file = state_dir / "state.json"
        self.key = state_dir / "id_ed25519"
        self.known_hosts = state_dir / "known_hosts"
        self.spec = state_dir / "spec.yml"

    def ssh_options(self) -> list[str]:
        """ssh's options for the operator's logins to lab nodes: the operator's key, host keys
        verified against the lab's known_hosts, no prompt."""
        return [
            "-i",
            str(self.key),
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "LogLevel=ERROR",
        ]

    # -- reading ---------------------------------------------------------------------------

    def nodes(self) -> list[LabNode]:
        if not self.state_file.exists():
            return []
        return [LabNode(**raw) for raw in json.loads(self.state_file.read_text())["nodes"]]

    def leftovers(self) -> dict[str, list[str]]:
        """Every lab object that exists on this machine, found by name."""
        netns = [
            line.split()[0]
            for line in _run("ip", "netns", "list", check=False).stdout.splitlines()
            if line.startswith(PREFIX)
        ]
        links = [
            line.split(":")[1].strip().split("@")[0]
            for line in _run("ip", "-o", "link", "show", check=False).stdout.splitlines()
            if line.split(":")[1].strip().startswith((PREFIX, BRIDGE))
        ]
        pids = [pid for ns in netns for pid in self._netns_pids(ns)]
        return {
            "netns": netns,
            "links": links,
            "pids": [str(p) for p in pids],
            "files": [str(self.state_dir)] if self.state_dir.exists() else [],
        }

    def is_up(self) -> bool:
        return any(self.leftovers().values())

    def status(self) -> list[dict[str, object]]:
        rows = []
        for node in self.nodes():
            alive = node.pid > 0 and _alive(node.pid)
            rows.append(
                {
                    "name": node.name,
                    "address": node.address,
                    "pid": node.pid,
                    "process": alive,
                    "ssh": alive and _ssh_banner(node.address, timeout=1.0),
                }
            )
        return rows

    # -- up --------------------------------------------------------------------------------

    def up(self, count: int, log=print, decoy: bool = True, rails: int = 0) -> list[LabNode]:
        if os.geteuid() != 0:
            raise LabError("the lab needs root (namespaces, mounts, veth)")
        if not 1 <= count <= MAX_NODES:
            raise LabError(f"node count must be 1..{MAX_NODES}, got {count}")
        if not 0 <= rails <= MAX_RAILS:
            raise LabError(f"rails must be 0..{MAX_RAILS}, got {rails}")
        missing = [c for c in REQUIRED_COMMANDS if not _which(c)]
        if missing:
            raise LabError(
                f"missing on this machine: {', '.join(missing)} "
                "(apt-get install iproute2 openssh-server openssh-client tini)"
            )
        if self.is_up():
            n = len(self.nodes())
            raise LabError(f"a lab is already up ({n} nodes); `python -m lab down` first")
        started = time.monotonic()
        try:
            nodes = self._up(count, decoy)
            if rails:
                self.add_rails(rails)
        except BaseException:
            log("lab: up failed; tearing down what was started")
            self.down(log=lambda *_: None)
            raise
        log(
            f"lab: {count} nodes up in {time.monotonic() - started:.1f}s "
            f"({', '.join(f'{n.name}={n.address}' for n in nodes)})"
        )
        return nodes

    def _up(self, count: int, decoy: bool) -> list[LabNode]:
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=False)
        nodes = [node_for(i) for i in range(1, count + 1)]
        self._save(nodes)  # saved first: a failed `up` can always be torn down
        _run(
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "trainfleet-lab-operator",
            "-f",
            str(self.key),
        )
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        Path(f"/proc/sys/net/ipv6/conf/{BRIDGE}/disable_ipv6").write_text("1\n")
        operator_key = (self.state_dir / "id_ed25519.pub").read_text()
        image = ensure_image()
        for node in nodes:
            self._network(node, decoy)
            self._prepare_layer(node, operator_key)
            if image:
                install_image(image, node.dir / "upper")
            node.pid = self._boot(node)
            self._save(nodes)
        self._wait_for_ssh(nodes)
        self._write_known_hosts(nodes)
        self._write_spec(nodes)
        return nodes

    def _network(self, node: LabNode, decoy: bool) -> None:
        veth = PREFIX + node.name
        _run("ip", "netns", "add", node.netns)
        if decoy:
            # A second NIC on a subnet no peer can reach, created first so it comes first in
            # every listing: the naive "first interface that is not lo" choice picks it.
            index = int(node.address.rsplit(".", 1)[1])
            # A veth whose peer stays down inside the node: a NIC that leads nowhere
            # (this kernel may lack the dummy driver).
            _run(
                "ip",
                "-n",
                node.netns,
                "link",
                "add",
                DECOY_NIC,
                "type",
                "veth",
                "peer",
                "name",
                DECOY_NIC + "-void",
            )
            _run(
                "ip",
                "-n",
                node.netns,
                "addr",
                "add",
                f"{SUBNET}.{index + DECOY_OFFSET}/25",
                "dev",
                DECOY_NIC,
            )
            _run("ip", "-n", node.netns, "link", "set", DECOY_NIC, "up")
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
        _run("ip", "link", "set", veth, "master", BRIDGE, "up")
        # No IPv6 and no default route: nothing a node sends can leave the lab.
        _run(
            "ip",
            "netns",
            "exec",
            node.netns,
            "sysctl",
            "-q",
            "-w",
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
        )
        _run("ip", "-n", node.netns, "link", "set", "lo", "up")
        _run("ip", "-n", node.netns, "addr", "add", f"{node.address}/24", "dev", "eth0")
        _run("ip", "-n", node.netns, "link", "set", "eth0", "up")

    def add_rails(self, rails: int) -> None:
        """Give every node of the lab that is up ``rails`` more interfaces, rail r (1..) being
        eth<r> on a bridge and subnet of its own, and declare them in the lab's spec
        (``preflight.rails``); a lab that already has rails gets them replaced."""
        if not 1 <= rails <= MAX_RAILS:
            raise LabError(f"rails must be 1..{MAX_RAILS}, got {rails}")
        nodes = self.nodes()
        if not nodes:
            raise LabError("the lab is not up (`python -m lab up 3 --rails 2`)")
        self.remove_rails()
        for rail in range(1, rails + 1):
            bridge = rail_bridge(rail)
            _run("ip", "link", "add", bridge, "type", "bridge")
            Path(f"/proc/sys/net/ipv6/conf/{bridge}/disable_ipv6").write_text("1\n")
            _run("ip", "link", "set", bridge, "up")
            for node in nodes:
                self._rail(node, rail, bridge)
        self._write_spec(nodes, rails)

    def _rail(self, node: LabNode, rail: int, bridge: str) -> None:
        host = node.address.rsplit(".", 1)[1]
        veth = f"{PREFIX}{int(host) - FIRST_HOST + 1}r{rail}"  # at most 15 characters
        inside = rail_interface(rail)
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", inside, "netns", node.netns)
        _run("ip", "link", "set", veth, "master", bridge, "up")
        address = f"198.18.{RAIL_SUBNET_BASE + rail}.{host}/24"
        _run("ip", "-n", node.netns, "addr", "add", address, "dev", inside)
        _run("ip", "-n", node.netns, "link", "set", inside, "up")

    def remove_rails(self) -> None:
        """The rails' bridges and veths gone (each node's end goes with its pair), the spec
        without them: the lab as `up` without --rails made it."""
        for link in self.leftovers()["links"]:
            if re.fullmatch(re.escape(PREFIX) + r"(rail\d+|\d+r\d+)", link):
                _run("ip", "link", "delete", link, check=False)
        if self.spec.exists():
            self._write_spec(self.nodes())

    def _prepare_layer(self, node: LabNode, operator_key: str) -> None:
        """The node's first boot state: own host keys, machine-id and a DHCP-style hostname."""
        upper = node.dir / "upper"
        for sub in ("upper", "work", "root"):
            (node.dir / sub).mkdir(parents=True)
        ssh_dir = mkdirs_like_host(upper, "etc/ssh")
        for lower_key in Path("/etc/ssh").glob("ssh_host_*"):
            _whiteout(ssh_dir / lower_key.name)
        for kind in ("ed25519", "ecdsa"):
            key = ssh_dir / f"ssh_host_{kind}_key"
            for part in (key, key.with_name(key.name + ".pub")):
                if part.exists():
                    part.unlink()
            _run(
                "ssh-keygen", "-q", "-t", kind, "-N", "", "-C", f"root@{node.name}", "-f", str(key)
            )
        (upper / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
        (upper / "etc/hostname").write_text("ip-" + node.address.replace(".", "-") + "\n")
        # A fresh server's root home: Debian's own dotfiles and the operator's key, nothing of
        # the host's (its ~/.ssh, and a ~/.bashrc that may run pyenv or conda on every login).
        root = mkdirs_like_host(upper, "root")
        os.setxattr(root, "trusted.overlay.opaque", b"y")
        for name in ("bashrc", "profile"):
            skeleton = ROOT_DOTFILES / f"dot.{name}"
            if skeleton.is_file():
                shutil.copyfile(skeleton, root / f".{name}")
        root_ssh = mkdirs_like_host(upper, "root/.ssh")
        os.chmod(root_ssh, 0o700)
        authorized = root_ssh / "authorized_keys"
        authorized.write_text(operator_key)
        os.chmod(authorized, 0o600)
        # Lab nodes are throwaway: dpkg need not fsync, and man-db need not reindex (3x faster).
        dpkg_cfg = mkdirs_like_host(upper, "etc/dpkg/dpkg.cfg.d")
        (dpkg_cfg / "trainfleet-lab").write_text("force-unsafe-io\n")
        if Path("/var/lib/man-db/auto-update").exists():
            _whiteout(mkdirs_like_host(upper, "var/lib/man-db") / "auto-update")

    def _boot(self, node: LabNode) -> int:
        log = open(node.dir / "node.log", "ab")
        process = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                node.netns,
                "unshare",
                "--mount",
                "--uts",
                "--ipc",
                "--pid",
                "--fork",
                "--kill-child",
                "sh",
                str(BOOT_SCRIPT),
                str(node.dir / "root"),
                str(node.dir / "upper"),
                str(node.dir / "work"),
                str(self.state_dir),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        return process.pid

    def _wait_for_ssh(self, nodes: list[LabNode]) -> None:
        deadline = time.monotonic() + SSH_WAIT_SECONDS
        waiting = list(nodes)
        while waiting and time.monotonic() < deadline:
            waiting = [n for n in waiting if not _ssh_banner(n.address, timeout=0.5)]
            if waiting:
                time.sleep(0.1)
        if waiting:
            details = "; ".join(f"{n.name}: {_tail(n.dir / 'node.log')}" for n in waiting)
            raise LabError(f"sshd did not come up within {SSH_WAIT_SECONDS:.0f}s on {details}")

    def _write_known_hosts(self, nodes: list[LabNode]) -> None:
        lines = []
        for node in nodes:
            for pub in sorted((node.dir / "upper/etc/ssh").glob("ssh_host_*_key.pub")):
                if not pub.is_file():  # a whiteout hiding the host's own key
                    continue
                kind, key = pub.read_text().split()[:2]
                lines.append(f"{node.name},{node.address} {kind} {key}\n")
        self.known_hosts.write_text("".join(lines))

    def _write_spec(self, nodes: list[LabNode], rails: int = 0) -> None:
        spec = {
            "cluster": {"name": "lab", "domain": "lab.trainfleet.test", "mesh_users": ["root"]},
            "ssh": {
                "user": "root",
                "port": 22,
                "key": str(self.key),
                "known_hosts": str(self.known_hosts),
            },
            "nodes": [{"name": n.name, "address": n.address, "gpus": 0} for n in nodes],
        }
        _, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        if hard != resource.RLIM_INFINITY:
            # pam_limits raises a hard limit only with CAP_SYS_RESOURCE, which a container
            # running the lab may lack: the lab asks for what its sshd can give.
            spec["gpu"] = {"memlock": max(64, hard // 1024)}
        if rails:  # the nodes have no RDMA: their rails are these interfaces
            spec["preflight"] = {"rails": [rail_interface(r) for r in range(1, rails + 1)]}
        self.spec.write_text(
            "# Written by `python -m lab up`; read by inventories/lab.py.\n"
            + yaml.safe_dump(spec, sort_keys=False)
        )

    def _save(self, nodes: list[LabNode]) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"nodes": [asdict(n) for n in nodes]}, indent=1))
        tmp.replace(self.state_file)

    # -- one node ----------------------------------------------------------------------------

    def stop(self, name: str) -> None:
        """Power a node off: its processes end; its network and disk stay for ``start``."""
        node = self.node(name)
        pids = set(self._netns_pids(node.netns))
        for pid in pids:
            _kill(pid)
        _wait_gone(pids | {node.pid}, timeout=10.0)

    def start(self, name: str) -> None:
        """Boot a stopped node again, with the disk (upper layer) it had."""
        nodes = self.nodes()
        node = next(n for n in nodes if n.name == self.node(name).name)
        if self._netns_pids(node.netns):
            raise LabError(f"{name} is running")
        node.pid = self._boot(node)
        self._save(nodes)
        self._wait_for_ssh([node])

    def node(self, name: str) -> LabNode:
        for node in self.nodes():
            if node.name == name:
                return node
        raise LabError(
            f"no node {name!r} in the lab (nodes: "
            f"{', '.join(n.name for n in self.nodes()) or 'none'})"
        )

    # -- down ------------------------------------------------------------------------------

    def down(self, log=print) -> dict[str, list[str]]:
        """Remove every lab object; return what is still there (empty when clean)."""
        found = self.leftovers()
        # Only processes inside the lab's own network namespaces, i.e. the ones it started.
        pids = {int(p) for p in found["pids"]}
        pids |= {n.pid for n in self.nodes() if n.pid and _is_lab_process(n.pid)}
        for pid in pids:
            _kill(pid)
        _wait_gone(pids, timeout=10.0)
        for ns in found["netns"]:
            _run("ip", "netns", "delete", ns, check=False)
        for link in self.leftovers()["links"]:
            _run("ip", "link", "delete", link, check=False)
        if self.state_dir.exists():
            subprocess.run(["rm", "-rf", "--one-file-system", str(self.state_dir)], check=False)
        remaining = {k: v for k, v in self.leftovers().items() if v}
        if remaining:
            log(f"lab: could not remove: {remaining}")
        elif any(found.values()):
            log(f"lab: down ({len(found['netns'])} nodes removed)")
        else:
            log("lab: nothing to take down")
        return remaining

    @staticmethod
    def _netns_pids(netns: str) -> list[int]:
        out = _run("ip", "netns", "pids", netns, check=False).stdout
        return [int(p) for p in out.split()]


def _which(command: str) -> bool:
    if "/" in command:
        return os.access(command, os.X_OK)
    return any(os.access(Path(d) / command, os.X_OK) for d in os.environ.get("PATH", "").split(":"))


def _ssh_banner(address: str, timeout: float) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _is_lab_process(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(arg.decode(errors="replace").startswith(PREFIX) for arg in cmdline)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait_gone(pids: set[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:  # reap it if it is our own child (an `up` in this process), else it stays a zombie
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return (
            " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
            or "(no output)"
        )
    except OSError:
        return "(no log)"
