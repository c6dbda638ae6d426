"""The cluster spec's schema: every key, its type, its default, its grammar and what it means.

One table drives validation (``spec.py``) and the README's reference
(``python -m trainfleet schema``), so the two cannot disagree.

Every string the spec can hold (values, list items, mapping keys and values) has an
allowlist grammar here, matched with ``re.fullmatch`` (``$`` would accept a trailing
newline): trainfleet runs as root on nodes other people log in to, and spec values land in
shell scripts, ``~/.ssh/config``, ``/etc/environment`` and package sources.
"""

from __future__ import annotations

import ipaddress
import json
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from trainfleet.nccl import ENV_NAME, ENV_PREFIXES

# A check returns None when the value is fine, else a message saying what is wrong.
Check = Callable[[Any], "str | None"]

# The text every managed-block marker holds: a value carrying it could end a block early.
MARKER_TEXT = "trainfleet managed block"

# Control, format (bidi overrides, zero-width), surrogate, private-use and unassigned
# characters, and the line/paragraph separators U+2028/U+2029 (U+0085 is a control).
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})

_LABEL = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
)  # ASCII only: no IGNORECASE (K, ſ)
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_CLUSTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_IFNAME = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")
_NODE_PATH = re.compile(r"(?:/[A-Za-z0-9._+@,=:~-]+)+/?|/")
_URL_CHARS = re.compile(r"[A-Za-z0-9._~%/:+-]+")
_ENV_VALUE = re.compile(r"[A-Za-z0-9_.,:=^/%+@ -]*")
_MCA_NAME = re.compile(r"[a-z][a-z0-9_]*")


def text_problem(value: str) -> str | None:
    """Any string: no character that could start a new line or hide text (see
    _UNSAFE_CATEGORIES)."""
    if value.isascii() and value.isprintable():  # the common case, at C speed: U+0020..U+007E only
        return None
    for char in value:
        if unicodedata.category(char) in _UNSAFE_CATEGORIES:
            return f"{value!r} contains the control or line-separator character U+{ord(char):04X}"
    return None


def hostname_problem(value: str) -> str | None:
    """RFC 1123 host name: dot-separated labels of letters, digits and inner hyphens."""
    if problem := text_problem(value):
        return problem
    if len(value) > 253:
        return f"{value!r} is longer than 253 characters"
    if not all(_LABEL.fullmatch(label) for label in value.split(".")):
        return (
            f"{value!r} is not a valid hostname (RFC 1123: labels of 1-63 letters, "
            "digits and hyphens, not starting or ending with a hyphen)"
        )
    return None


def short_name_problem(value: str) -> str | None:
    if "." in value:
        return f"{value!r} must be a short name without dots (set cluster.domain for the FQDN)"
    return hostname_problem(value)


def cluster_name_problem(value: str) -> str | None:
    """A file name of its own: it names the key store's directory and key comments."""
    if _CLUSTER_NAME.fullmatch(value):
        return None
    return (
        f"{value!r} is not a valid cluster name (1-64 letters, digits and '._-', "
        "starting with a letter or digit)"
    )


def user_problem(value: str) -> str | None:
    """A portable user name, as useradd's default NAME_REGEX takes it (no Samba-style trailing
    '$')."""
    if _USER.fullmatch(value):
        return None
    return (
        f"{value!r} is not a valid user name (1-32 of lower-case letters, digits, '_' and '-', "
        "starting with a letter or '_')"
    )


def address_problem(value: str) -> str | None:
    """An IPv4/IPv6 address in canonical form, without a scope id (it names a local interface)."""
    if problem := text_problem(value):
        return problem
    if "%" in value:
        return f"{value!r} has a scope id: a cluster address must be reachable from every node"
    try:
        canonical = str(ipaddress.ip_address(value))
    except ValueError:
        return f"{value!r} is not an IPv4 or IPv6 address"
    if canonical != value:  # nodes report addresses canonically; compared as text
        return f"{value!r} is not in canonical form: write it as {canonical!r}"
    return None


def port_problem(value: int) -> str | None:
    return None if 1 <= value <= 65535 else f"{value} is not a TCP port (1-65535)"


def non_negative(value: int) -> str | None:
    return None if value >= 0 else f"must be 0 or more, got {value}"


def pattern(regex: str, example: str) -> Check:
    compiled = re.compile(regex, re.ASCII)  # \d is 0-9 only, not every script's digits

    def check(value: str) -> str | None:
        if compiled.fullmatch(value):
            return None
        return f"{value!r} is not a valid version (expected the form {example!r})"

    return check


def controller_path_problem(value: str) -> str | None:
    """A path on the controller (``~`` expanded): any text on one line."""
    if not value:
        return "must be a path, got an empty string"
    return text_problem(value)


def node_path_problem(value: str) -> str | None:
    """An absolute path on the nodes: portable file-name characters, no '..'."""
    if problem := text_problem(value):
        return problem
    if not value.startswith("/"):
        return f"{value!r} must be an absolute path on the nodes"
    if ".." in value.split("/"):
        return f"{value!r} must not contain '..'"
    if not _NODE_PATH.fullmatch(value):
        return f"{value!r} may contain only letters, digits, '/' and '._+@,=:~-'"
    return None


def url_problem(value: str, file_ok: bool = False) -> str | None:
    """An https:// (or http://, see stack.insecure) URL of a mirror: host, optional port and path;
    with ``file_ok`` also ``file:///path``, a copy on every node.

    No spaces, quotes or brackets (they would add options to an apt source line), no
    credentials (repo files are world-readable), no query or fragment.
    """
    if problem := text_problem(value):
        return problem
    if file_ok and value.startswith("file://"):
        path = value.removeprefix("file://")
        return (
            None
            if path.startswith("/") and not node_path_problem(path)
            else f"{value!r} is not file:// and an absolute path on the nodes (e.g. 'file:///srv/mirror')"
        )
    if not value.startswith(("https://", "http://")):
        return f"{value!r} must be an https:// URL" + (
            " (or file:///path on the nodes)" if file_ok else ""
        )
    if not _URL_CHARS.fullmatch(value):
        return (
            f"{value!r} may contain only letters, digits and '._~%/:+-' "
            "(no spaces, quotes, brackets, credentials, query or fragment)"
        )
    if re.search(r"%(?![0-9A-Fa-f]{2})", value):
        return f"{value!r} has a '%' that is not a percent-escape"
    host, colon, port = urlsplit(value).netloc.partition(":")
    if not host or hostname_problem(host):
        return f"{value!r} does not name a valid host"
    if colon and not (port.isdigit() and 1 <= int(port) <= 65535):
        return f"{value!r} has an invalid port"
    return None


def fingerprint_problem(value: str) -> str | None:
    if re.fullmatch(r"[0-9A-F]{40}", value):
        return None
    return f"{value!r} is not an OpenPGP v4 fingerprint (40 hex digits, upper case)"


def env_value_problem(value: Any) -> str | None:
    """One value of an environment variable or MCA parameter: a string or an integer on one line.

    It lands in /etc/environment (pam_env strips quotes, cuts at '#', joins a line ending
    in a backslash), nccl.conf, mca-params.conf, .deepspeed_env and shell scripts.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return f"value must be a string or integer, got {type(value).__name__}"
    text = str(value)
    if problem := text_problem(text):
        return problem
    if MARKER_TEXT in text.lower():
        return f"{text!r} contains trainfleet's marker text {MARKER_TEXT!r}"
    if text != text.strip():
        return f"{text!r} starts or ends with a space"
    if not _ENV_VALUE.fullmatch(text):
        return f"{text!r} may contain only letters, digits, spaces and '_.,:=^/%+@-'"
    return None


def ifname_problem(value: str) -> str | None:
    """NCCL's interface list: `auto`, or names after an optional '^' (exclude) and '=' (exact)."""
    if value == "auto":
        return None
    match = re.fullmatch(r"\^?=?(.*)", value, re.DOTALL)
    names = match.group(1).split(",") if match else []
    if all(_IFNAME.fullmatch(n) for n in names):
        return None
    return f"{value!r} is not 'auto' or an interface name list (e.g. '=eth0')"


def env_name_problem(value: Any) -> str | None:
    """A name ``nccl.env`` may not set: not of the families trainfleet.nccl.ENV_PREFIXES lists."""
    if isinstance(value, str) and ENV_NAME.fullmatch(value):
        return None
    return f"{value!r} is not an {'/'.join(ENV_PREFIXES)} variable name"


def tcp_include_problem(value: str) -> str | None:
    """`auto`, interface names (`eth0,eth1`) or IPv4 subnets (`198.18.0.0/24`), as OpenMPI takes
    them."""
    if value == "auto":
        return None
    for item in value.split(","):
        if "/" in item:
            if not re.fullmatch(r"[0-9./]+", item):
                return f"{item!r} is not a subnet in CIDR form"
            try:
                ipaddress.IPv4Network(item)
            except ValueError as exc:
                return f"{item!r} is not a subnet in CIDR form ({exc})"
        elif not _IFNAME.fullmatch(item):
            return f"{item!r} is not an interface name or a subnet (e.g. 'eth0' or '198.18.0.0/24')"
    return None


_DIST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,98}[A-Za-z0-9])?", re.ASCII)  # PEP 508 names
# An exact PEP 440 release: N(.N)*, then optional pre/post/dev parts and a local label (+cpu)
_DIST_VERSION = re.compile(
    r"[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?(\+[a-z0-9]+(\.[a-z0-9]+)*)?",
    re.ASCII,
)


def dist_name_problem(value: Any) -> str | None:
    if not isinstance(value, str) or not _DIST_NAME.fullmatch(value):
        return f"{value!r} is not a Python package name (e.g. 'deepspeed')"
    if normalized_dist(value) == "torch":
        return "torch is pinned by stack.torch"
    return None


def dist_version_problem(value: Any) -> str | None:
    if not isinstance(value, str) or not _DIST_VERSION.fullmatch(value):
        return f"{value!r} is not an exact version (e.g. '0.19.8'; quote it in YAML)"
    return None


def python_pin_problem(value: Any) -> str | None:
    """One ``stack.python`` value: an exact version, or ``{version: V, deps: false}`` for a
    package installed without its declared requirements (ColossalAI pins an older torch)."""
    if isinstance(value, dict):
        if set(value) - {"version", "deps"} or "version" not in value:
            return f"{value!r} must be a version or {{version: V, deps: false}}"
        if not isinstance(value.get("deps", True), bool):
            return f"deps must be true or false, got {value['deps']!r}"
        return dist_version_problem(value["version"])
    return dist_version_problem(value)


def normalized_dist(name: str) -> str:
    """PEP 503's normal form: what pip and importlib.metadata compare names by."""
    return re.sub(r"[-_.]+", "-", name).lower()


def mca_name_problem(value: Any) -> str | None:
    if not isinstance(value, str) or not _MCA_NAME.fullmatch(value):
        return f"{value!r} is not an MCA parameter name (e.g. 'pml')"
    if value in ("btl_tcp_if_include", "oob_tcp_if_include"):
        return f"{value} is set by openmpi.tcp_include"
    return None


@dataclass(frozen=True)
class Key:
    """One key of the spec: its type, default, grammar and documentation."""

    type: type | tuple[type, ...]
    default: Any
    doc: str
    check: Check | None = None  # the whole value (not called for null)
    required: bool = False
    items: type | None = None  # element type, for lists
    example: Any = None
    each: Check | None = None  # every list item, or every mapping value
    each_key: Check | None = None  # every mapping key
    accepts: str = ""  # the grammar in words, for the reference


@dataclass(frozen=True)
class Section:
    """A mapping of keys, documented as one table in the README."""

    keys: dict[str, Key | Section]
    doc: str


NULL = type(None)
VERSION = "digits and dots, as in the example"

SSH = Section(
    doc="How the controller (and the SSH mesh) reaches a node. Per node, override any key.",
    keys={
        "user": Key(
            str,
            "root",
            "User pyinfra connects as: root, or a user with passwordless sudo (`become: sudo`).",
            check=user_problem,
            accepts="user name: `[a-z_][a-z0-9_-]{0,31}`",
        ),
        "become": Key(
            (str, NULL),
            None,
            "`sudo`: every command, upload and check runs as root through the login user's "
            "passwordless sudo (`sudo -n`: a node that asks for a password fails with one clear "
            "error, never waits); null: `user` is root.",
            check=lambda v: None if v == "sudo" else f"{v!r} must be 'sudo' (or null)",
            accepts="`sudo`, or null",
        ),
        "port": Key(int, 22, "sshd port of the node.", check=port_problem, accepts="1-65535"),
        "key": Key(
            (str, NULL),
            None,
            "Private key the controller uses (path); null: ssh-agent / default keys.",
            check=controller_path_problem,
            accepts="controller path, one line",
        ),
        "known_hosts": Key(
            (str, NULL),
            None,
            "known_hosts file the controller verifies host keys against; null: ~/.ssh/known_hosts. "
            "Host-key checking is never switched off.",
            check=controller_path_problem,
            accepts="controller path, one line",
        ),
    },
)

MESH_MODES = ("certificates", "keys")

CLUSTER_SSH = Section(
    doc=SSH.doc + " `mesh` and `certificate_days` are cluster-wide.",
    keys={
        **SSH.keys,
        "mesh": Key(
            str,
            "certificates",
            "How the SSH mesh trusts: `certificates` (the cluster CA signs each node's host key "
            "and each mesh user's key; every node holds one CA line, whatever the cluster's size) "
            "or `keys` (every node's host key and public key on every node). Switching moves the "
            "mesh in one deploy.",
            check=lambda v: None if v in MESH_MODES else f"{v!r} must be 'certificates' or 'keys'",
            accepts="`certificates`, `keys`",
        ),
        "certificate_days": Key(
            int,
            365,
            "Validity of host and user certificates; the deploy signs them again once less "
            "than a third is left, and drift names a node whose certificate is in that last third.",
            check=lambda v: None if 1 <= v <= 3650 else f"must be 1 to 3650 days, got {v}",
            accepts="1-3650",
        ),
    },
)

NCCL = Section(
    doc="NCCL network environment. `auto` values are derived per node from its cluster address and "
    "sysfs.",
    keys={
        "socket_ifname": Key(
            str,
            "auto",
            "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME; `auto` = the interface holding the node's "
            "address.",
            check=ifname_problem,
            accepts="`auto`, or `^`/`=` then names `[A-Za-z0-9_.:@-]{1,15}`, comma-separated",
        ),
        "ib": Key(
            str,
            "auto",
            "`auto` (use active InfiniBand/RoCE ports, else disable) or `disable`.",
            check=lambda v: (
                None if v in ("auto", "disable") else f"{v!r} must be 'auto' or 'disable'"
            ),
            accepts="`auto` or `disable`",
        ),
        "env": Key(
            dict,
            {},
            "Extra variables passed through as given, e.g. `NCCL_DEBUG: WARN`.",
            each_key=env_name_problem,
            each=env_value_problem,
            example={"NCCL_DEBUG": "WARN"},
            accepts="names `(NCCL|GLOO|TORCH|CUDA|UCX)_[A-Z0-9_]+`; values integers or "
            "`[A-Za-z0-9_.,:=^/%+@ -]*`, no leading/trailing space, no marker text",
        ),
    },
)

OPENMPI = Section(
    doc="OpenMPI's network, written to every mesh user's `~/.openmpi/mca-params.conf` and the "
    "mpirun line.",
    keys={
        "tcp_include": Key(
            str,
            "auto",
            "btl_tcp_if_include / oob_tcp_if_include; `auto` = the cluster interface's name if all "
            "nodes share it, else the cluster subnets (CIDR).",
            check=tcp_include_problem,
            example="198.18.0.0/24",
            accepts="`auto`, or interface names / IPv4 CIDR subnets, comma-separated",
        ),
        "params": Key(
            dict,
            {},
            "Extra MCA parameters, e.g. `pml: ucx` (Debian's system file disables UCX).",
            each_key=mca_name_problem,
            each=env_value_problem,
            example={"pml": "ucx"},
            accepts="names `[a-z][a-z0-9_]*`; values as `nccl.env`'s",
        ),
    },
)

STACK = Section(
    doc="Pinned software stack; null leaves that component unmanaged. Every node gets exactly "
    "these.",
    keys={
        "cuda": Key(
            (str, NULL),
            None,
            "CUDA toolkit version.",
            check=pattern(r"\d+\.\d+(\.\d+)?", "12.4"),
            example="12.4",
            accepts="`12.4`, `12.4.1`",
        ),
        "cudnn": Key(
            (str, NULL),
            None,
            "cuDNN version.",
            check=pattern(r"\d+(\.\d+){1,3}(-\d+(\+cuda\d+\.\d+)?)?", "9.1.0.70"),
            example="9.1.0.70",
            accepts="`9.1.0.70`, `9.1.0.70-1+cuda12.4`",
        ),
        "nccl": Key(
            (str, NULL),
            None,
            "NCCL version (libnccl2).",
            check=pattern(r"\d+\.\d+\.\d+(-\d+(\+cuda\d+\.\d+)?)?", "2.21.5-1"),
            example="2.21.5-1",
            accepts="`2.21.5`, `2.21.5-1+cuda12.4`",
        ),
        "torch": Key(
            (str, NULL),
            None,
            "PyTorch version in the node venv.",
            check=pattern(r"\d+\.\d+\.\d+(\+[a-z0-9]+)?", "2.4.1"),
            example="2.4.1",
            accepts="`2.4.1`, `2.4.1+cu124`",
        ),
        "torch_cuda": Key(
            (str, NULL),
            None,
            "PyTorch CUDA variant (wheel index).",
            check=pattern(r"cu\d{3,4}|cpu", "cu124"),
            example="cu124",
            accepts="`cu124`, `cpu`",
        ),
        "openmpi": Key(
            (str, NULL),
            None,
            "OpenMPI package version (Debian/Ubuntu `openmpi-bin`, RHEL `openmpi`), exact and "
            "held: the runtime `mpirun.sh` and `horovod.sh` use.",
            check=pattern(r"\d+\.\d+(\.\d+)?-[0-9A-Za-z.+~]+", "4.1.4-3+b1"),
            example="4.1.4-3+b1",
            accepts="the package version with its release, as `apt-cache policy openmpi-bin` or "
            "`dnf list openmpi` shows it: `4.1.4-3+b1`, `4.1.1-5.el8`",
        ),
        "python": Key(
            dict,
            {},
            "Python packages in the node venv beside torch, each at exactly this version "
            "(from `wheelhouse`, else the node's pip index); never upgraded silently.",
            each_key=dist_name_problem,
            each=python_pin_problem,
            example={"accelerate": "1.15.0", "deepspeed": "0.19.8"},
            accepts="names `[A-Za-z0-9._-]`; exact versions as strings: `1.15.0`, `2.1.0rc1`, "
            "`0.4.post1`, or `{version: V, deps: false}` to install one without its requirements",
        ),
        "driver": Key(
            (str, NULL),
            None,
            "NVIDIA driver on nodes with GPUs: a branch (`550`: its newest release) or an exact "
            "version, installed and held; at least what `stack.cuda` needs (CUDA 12.x: 525.60.13).",
            check=pattern(r"[0-9]{3}(\.[0-9]{1,3}){0,2}", "550.54.15"),
            example="550.54.15",
            accepts="`550`, `550.54.15`",
        ),
        "gcc": Key(
            (str, NULL),
            None,
            "GCC major version (devtoolset / gcc-toolset / gcc-N).",
            check=pattern(r"\d{1,2}", "11"),
            example="11",
            accepts="1-2 digits",
        ),
        "wheelhouse": Key(
            (str, NULL),
            None,
            "Directory on every node holding torch and its dependency wheels (air-gapped "
            "clusters); null: the variant's index.",
            check=node_path_problem,
            accepts="absolute path of `[A-Za-z0-9._+@,=:~-]` names, no `..`",
        ),
        "torch_index": Key(
            (str, NULL),
            None,
            "Mirror of the PyTorch wheel index; null: download.pytorch.org/whl/<torch_cuda>.",
            check=url_problem,
            accepts="`https://host[:port]/path` of `[A-Za-z0-9._~%/:+-]`",
        ),
        "cuda_repo": Key(
            (str, NULL),
            None,
            "Mirror of NVIDIA's CUDA repositories root; null: developer.download.nvidia.com.",
            check=partial(url_problem, file_ok=True),
            accepts="`https://host[:port]/path` of `[A-Za-z0-9._~%/:+-]`, or `file:///path` on the "
            "nodes",
        ),
        "cuda_keyring_fingerprint": Key(
            (str, NULL),
            None,
            "The one key the cuda-keyring .deb may hold (checked before it is installed); null: "
            "NVIDIA's, pinned in trainfleet/defaults.py. For a mirror signed with its own key.",
            check=fingerprint_problem,
            accepts="40 hex digits, upper case",
        ),
        "insecure": Key(
            bool,
            False,
            "Allow plain-http mirrors (`cuda_repo`, `torch_index`); never for production.",
            accepts="`true`, `false`",
        ),
        "allow_change": Key(
            bool,
            False,
            "Let the deploy move a node whose installed CUDA/cuDNN/NCCL differs from the pins; "
            "false: such a node fails, unchanged.",
            accepts="`true`, `false`",
        ),
    },
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
            check=port_problem,
            accepts="1-65535",
        ),
    },
)

SMOKE_LAUNCHERS = ("torchrun", "mpirun", "deepspeed", "accelerate", "colossalai")


def smoke_launcher_problem(value: Any) -> str | None:
    if value not in SMOKE_LAUNCHERS:
        return f"{value!r} is not one of {', '.join(SMOKE_LAUNCHERS)}"
    return None


def memlock_problem(value: Any) -> str | None:
    if value == "unlimited" or (
        isinstance(value, int) and not isinstance(value, bool) and value >= 64
    ):
        return None
    return f"{value!r} must be 'unlimited' or KiB (64 or more)"


def positive_number(value: Any) -> str | None:
    return None if value > 0 else f"must be more than 0, got {value}"


GPU = Section(
    doc="Node settings multi-node GPU jobs depend on; set where the node has GPUs (`memlock`: "
    "every node).",
    keys={
        "persistence": Key(
            bool,
            True,
            "`nvidia-persistenced` enabled and active: the driver stays loaded between jobs "
            "(`nvidia-smi -q`: Persistence Mode Enabled).",
            accepts="`true`, `false` (unmanaged)",
        ),
        "fabric_manager": Key(
            str,
            "auto",
            "`auto`: a node whose GPUs sit on NVSwitches gets `nvidia-fabricmanager` at exactly "
            "the driver's version, active (a mismatch is CUDA error 802); `off`: unmanaged.",
            check=lambda v: None if v in ("auto", "off") else f"{v!r} must be 'auto' or 'off'",
            accepts="`auto`, `off`",
        ),
        "peermem": Key(
            str,
            "auto",
            "`auto`: a GPU node with active InfiniBand/RoCE loads `nvidia_peermem` now and at boot "
            "(GPUDirect RDMA; without it NCCL copies through the host); `off`: unmanaged.",
            check=lambda v: None if v in ("auto", "off") else f"{v!r} must be 'auto' or 'off'",
            accepts="`auto`, `off`",
        ),
        "memlock": Key(
            (str, int, NULL),
            "unlimited",
            "Locked-memory limit of every session (`/etc/security/limits.d`), as a non-login ssh "
            "session's `ulimit -l` shows it; too low and `ibv_reg_mr` fails. null: unmanaged.",
            check=memlock_problem,
            accepts="`unlimited`, or KiB (64 or more)",
        ),
        "max_clock_offset_ms": Key(
            int,
            100,
            "Largest clock offset a node may report (chrony/timesyncd), and spread "
            "between nodes' clocks the preflight accepts.",
            check=positive_number,
            accepts="1 or more",
        ),
    },
)

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

NODE = Section(
    doc="One entry per server, in rank order: the first node is the master.",
    keys={
        "name": Key(
            str,
            None,
            "Short hostname the node gets (unique).",
            check=short_name_problem,
            required=True,
            example="gpu-a01",
            accepts="RFC 1123 label: `[A-Za-z0-9]`, inner `-`, 1-63",
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
        # `nodes` is a list of NODE sections; handled by the validator.
    },
)


def type_name(t: type | tuple[type, ...]) -> str:
    names = {
        str: "string",
        int: "integer",
        float: "number",
        list: "list",
        dict: "mapping",
        bool: "boolean",
        NULL: "null",
    }
    if isinstance(t, tuple):
        return " or ".join(names.get(x, x.__name__) for x in t)
    return names.get(t, t.__name__)


def keys_grammar(section: Section) -> str:
    """What a section accepts, for its errors: the keys the reference lists under it."""
    return f"a mapping of {', '.join(section.keys)}"


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
