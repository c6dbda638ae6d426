"""The spec's grammar: the allowlist every value, list item, mapping key and mapping value
the spec can hold is matched against, and the types a section is built of (``Key``,
``Section``).

Each capability declares its own section of the spec (in its module, with its defaults and
docs), built of the grammars here; ``schema.py`` composes the spec from them. Every grammar is
matched with ``re.fullmatch`` (``$`` would accept a trailing newline): trainfleet runs as root
on nodes other people log in to, and spec values land in shell scripts, ``~/.ssh/config``,
``/etc/environment`` and package sources. Every allowlist is here, the ones only one section
uses too, so one module is what to review; it imports nothing of trainfleet (facts use it too).
"""

from __future__ import annotations

import builtins
import ipaddress
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
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


def released(shape: Check, exists: Check) -> Check:
    """``shape``'s grammar, then ``exists``: a value of the right shape that names no release."""

    def check(value: str) -> str | None:
        return shape(value) or exists(value)

    return check


def rendezvous_port_problem(value: int) -> str | None:
    """The master's rendezvous port: a TCP port above the system ports (22 is sshd's)."""
    if problem := port_problem(value):
        return problem
    if value < 1024:
        return (
            f"{value} is a system port (below 1024: 22 is sshd's); the rendezvous runs as the "
            "job's user on a port 1024-65535 (29500 by default)"
        )
    return None


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


def rail_interface_problem(value: Any) -> str | None:
    """One rail interface's name: what `ip link` may hold, no comma (one interface per rail)."""
    if isinstance(value, str) and _IFNAME.fullmatch(value):
        return None
    return f"{value!r} is not an interface name (`{_IFNAME.pattern}`)"


def preflight_python_problem(value: Any) -> str | None:
    """An existing env's python on the nodes: ``<env>/bin/python[3[.N]]``, an absolute path of
    safe characters (the launchers' files use ``<env>/bin``)."""
    if problem := node_path_problem(value):
        return problem
    if not re.fullmatch(r"(/[^/]+)+/bin/python(3(\.[0-9]{1,2})?)?", value, re.ASCII):
        return f"{value!r} is not an env's python (<env>/bin/python, python3 or python3.N)"
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


def memlock_problem(value: Any) -> str | None:
    if value == "unlimited" or (
        isinstance(value, int) and not isinstance(value, bool) and value >= 64
    ):
        return None
    return f"{value!r} must be 'unlimited' or KiB (64 or more)"


def positive_number(value: Any) -> str | None:
    return None if value > 0 else f"must be more than 0, got {value}"


@dataclass(frozen=True)
class Key:
    """One key of the spec: its type, default, grammar and documentation."""

    type: type | tuple[type, ...]
    default: Any
    doc: str
    check: Check | None = None  # the whole value (not called for null)
    required: bool = False
    items: builtins.type | None = None  # element type, for lists
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
