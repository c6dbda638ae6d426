"""Facts of the SSH mesh: host keys, a mesh user's SSH files, and the proof that the mesh works."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

from pyinfra.api import FactBase, StringCommand
from pyinfra.api.exceptions import FactProcessError

from facts.managed_block_facts import (
    AS_USER_FN,
    FILE_FN,
    USER_ENV_FN,
    BlockState,
    FileRead,
    block_state,
    decode_lines,
    encode_lines,
    file_line,
    read_file_lines,
    with_block_line,
    with_files,
)
from facts.shell import script, shell
from trainfleet.defaults import (
    HOST_CERT_SUFFIX,
    MESH_KEY_NAME,
    MESH_PROBE_PARALLEL,
    MESH_PROBE_TIMEOUT,
    REVOKED_KEYS,
    SSH_MAIN_CONF,
    SSH_MESH_CONF,
    SSHD_MAIN_CONF,
    SSHD_MESH_CONF,
)

AUTHORIZED_PURPOSE = "ssh mesh keys"
CONFIG_PURPOSE = "ssh mesh hosts"
KNOWN_HOSTS_PURPOSE = "ssh mesh host keys"


class SshHostKeys(FactBase[list[str]]):
    """
    The node's SSH host public keys as ``type base64`` (comments dropped), sorted.

    .. code:: python

        ["ecdsa-sha2-nistp256 AAAAE2Vj...", "ssh-ed25519 AAAAC3Nz..."]
    """

    def command(self) -> str:
        return "cat /etc/ssh/ssh_host_*_key.pub 2>/dev/null || true"

    def process(self, output: list[str]) -> list[str]:
        return sorted({" ".join(line.split()[:2]) for line in output if len(line.split()) >= 2})

    @staticmethod
    def default() -> list[str]:
        return []

    def answer(self, value: list[str], recorded: list[str]) -> list[str]:
        """The key files of a node holding ``value``'s keys: a recorded line (its comment kept)
        for each key it already has, the others as ``type base64``."""
        kept = [line for line in recorded if " ".join(line.split()[:2]) in value]
        have = {" ".join(line.split()[:2]) for line in kept}
        return kept + [key for key in value if key not in have]


class FileMeta(TypedDict):
    mode: str
    owner: str
    sha256: str | None


class SshUserT(TypedDict):
    exists: bool
    home: str | None
    group: str | None
    uid: str | None
    ssh_dir: FileMeta | None
    identity: FileMeta | None
    identity_pub: FileMeta | None
    authorized: BlockState
    config: BlockState
    certificate: str | None  # ~/.ssh/id_trainfleet-cert.pub, its first line; None: none


# Root looks the user up; everything in the home is read AS the user (setpriv, bounded in
# time), so a link the user planted can only show the user's own files. The user part's
# output is base64-encoded by root's shell: the user cannot forge the lines around it.
_USER_SCRIPT = AS_USER_FN + script("ssh_mesh_user.sh")

_USER_PART = FILE_FN + script("ssh_mesh_user_part.sh")


class SshMeshUser(FactBase[SshUserT]):
    """
    One mesh user's SSH state on the node, in one command: home, ``~/.ssh`` and the
    cluster key's mode/owner/sha256 (read as the user), and the managed blocks of
    ``authorized_keys`` and ``config`` (private key contents are never read back, only their hash).

    + user: the mesh user

    .. code:: python

        {
            "exists": True, "home": "/root", "group": "root", "uid": "0",
            "ssh_dir": {"mode": "700", "owner": "root", "sha256": None},
            "identity": {"mode": "600", "owner": "root", "sha256": "9f86d08..."},
            "identity_pub": {"mode": "644", "owner": "root", "sha256": "2c26b46..."},
            "authorized": {"exists": True,
                           "block": ["ssh-ed25519 AAAA... trainfleet:prod:root@gpu-a01"], ...},
            "config": {"exists": False, "block": None, "outside": [], "broken": None, ...},
        }
    """

    def command(self, user: str) -> StringCommand:
        return shell(_USER_SCRIPT, user, MESH_KEY_NAME, _USER_PART)

    def process(self, output: list[str]) -> SshUserT:
        if output[:1] == ["nouser"]:
            empty = block_state(None, AUTHORIZED_PURPOSE)
            return {
                "exists": False,
                "home": None,
                "group": None,
                "uid": None,
                "ssh_dir": None,
                "identity": None,
                "identity_pub": None,
                "authorized": empty,
                "config": empty,
                "certificate": None,
            }
        head = {
            key: value
            for key, _, value in (
                line.partition(" ") for line in output if not line.startswith("user ")
            )
        }
        user_lines = next(
            (decode_lines(line[len("user ") :]) for line in output if line.startswith("user ")),
            None,
        )
        if user_lines is None or not head.get("home"):
            raise FactProcessError("the mesh user's files could not be read")
        files = read_file_lines(user_lines)
        seen = {
            key: value
            for key, _, value in (
                line.partition(" ") for line in user_lines if not line.startswith("file ")
            )
        }
        if (
            not {"ssh_dir", "identity", "identity_pub"} <= seen.keys()
            or not {"authorized_keys", "config", "certificate"} <= files.keys()
        ):
            raise FactProcessError("the mesh user's files could not be read (as the user)")

        def meta(key: str) -> FileMeta | None:
            fields = seen[key].split()
            if fields == ["missing"]:
                return None
            if len(fields) != 3:
                raise FactProcessError(f"{key}: unreadable metadata {seen[key]!r}")
            return {
                "mode": fields[0],
                "owner": fields[1],
                "sha256": None if fields[2] == "-" else fields[2],
            }

        return {
            "exists": True,
            "home": head["home"],
            "group": head.get("group") or None,
            "uid": head.get("uid") or None,
            "ssh_dir": meta("ssh_dir"),
            "identity": meta("identity"),
            "identity_pub": meta("identity_pub"),
            "authorized": block_state(files["authorized_keys"], AUTHORIZED_PURPOSE),
            "config": block_state(files["config"], CONFIG_PURPOSE),
            "certificate": first_line(files["certificate"]),
        }

    def answer(self, value: dict[str, Any], recorded: list[str]) -> list[str]:
        """What the command prints for the user ``recorded`` shows once the user has
        ``value``'s home, key files (mode, owner, sha256), blocks and certificate: each block
        written into the recorded file as operations/managed_block_ops.py writes it (the
        config's first, its Host stanzas must come before the user's), the rest as recorded."""
        if not value.get("exists", True):
            return ["nouser"]
        head = {
            line.partition(" ")[0]: line
            for line in recorded
            if line != "nouser" and not line.startswith("user ")
        }
        for key in ("home", "uid", "group"):
            if key in value:
                head[key] = f"{key} {value[key] or ''}"
        encoded = next(
            (line[len("user ") :] for line in recorded if line.startswith("user ")), None
        )
        inner = decode_lines(encoded) if encoded is not None else list(_NO_FILES)
        return [*head.values(), "user " + encode_lines(_user_files(inner, value))]


_NO_FILES = (
    "ssh_dir missing",
    "identity missing",
    "identity_pub missing",
    file_line("authorized_keys", None),
    file_line("config", None),
    file_line("certificate", None),
)


def _meta_line(key: str, meta: FileMeta | None) -> str:
    if meta is None:
        return f"{key} missing"
    return f"{key} {meta['mode']} {meta['owner']} {meta['sha256'] or '-'}"


def _user_files(lines: list[str], value: dict[str, Any]) -> list[str]:
    """The user part's lines (``_USER_PART``) with ``value``'s files (SshMeshUser.answer)."""
    answers: dict[str, Callable[[str], list[str]]] = {}
    if "certificate" in value:
        certificate = value["certificate"]
        answers["certificate"] = lambda line: [
            file_line("certificate", certificate and certificate + "\n")
        ]
    for name, key, purpose, top in (
        ("authorized_keys", "authorized", AUTHORIZED_PURPOSE, False),
        ("config", "config", CONFIG_PURPOSE, True),
    ):
        if value.get(key) and value[key].get("block") is not None:
            answers[name] = _block_answer(purpose, value[key]["block"], top)
    out = [
        _meta_line(key, value[key])
        if (key := line.partition(" ")[0]) in _METAS and key in value
        else line
        for line in lines
    ]
    # a file the recording has no line for (one made before it was read) is missing there
    present = {line.split(" ", 2)[1] for line in out if line.startswith("file ")}
    out += [file_line(name, None) for name in answers if name not in present]
    return with_files(out, answers)


_METAS = ("ssh_dir", "identity", "identity_pub")


def _block_answer(purpose: str, block: list[str], top: bool) -> Callable[[str], list[str]]:
    return lambda line: [with_block_line(line, purpose, block, top)]


def first_line(read: FileRead) -> str | None:
    """A regular file's first line (a certificate file holds one), else None."""
    if read["state"] != "regular" or not read["data"]:
        return None
    return read["data"].decode("utf-8", "replace").split("\n", 1)[0].strip() or None


class SshdMeshT(TypedDict):
    includes_drop_ins: (
        bool  # sshd_config includes sshd_config.d/*.conf (else the drop-in is never read)
    )
    other_revoked_keys: list[str]  # sshd files other than trainfleet's that set RevokedKeys
    certificates: dict[str, str | None]  # host certificate path -> its line (None: no such file)
    drop_in: bytes | None  # trainfleet's sshd_config.d file
    revoked_keys: bytes | None  # the KRL
    client_includes_drop_ins: bool  # ssh_config includes ssh_config.d/*.conf for every host
    other_revoked_host_keys: list[str]  # other ssh client files that set RevokedHostKeys
    client_drop_in: bytes | None  # trainfleet's ssh_config.d file


_HOST_CERT_PATHS = tuple(
    f"/etc/ssh/ssh_host_{kind}_key{HOST_CERT_SUFFIX}" for kind in ("dsa", "ecdsa", "ed25519", "rsa")
)

# Root reads root's files in /etc/ssh: no user controls them. ssh_config's Include must be read
# for every host: outside any Host/Match block but `Host *` / `Match all` (ssh scopes an
# included file's lines to the block around its Include).
_SSHD_SCRIPT = FILE_FN + script("ssh_mesh_sshd.sh")


class SshdMesh(FactBase[SshdMeshT]):
    """
    sshd's part of a certificate mesh on the node: its host certificates, trainfleet's
    sshd_config.d file and key revocation list, whether sshd_config reads sshd_config.d, and
    any other file that sets ``RevokedKeys`` (sshd takes the first one it reads); and the ssh
    client's: trainfleet's ssh_config.d file, whether ssh_config reads ssh_config.d for every
    host, and any other system file that sets ``RevokedHostKeys``.

    .. code:: python

        {"includes_drop_ins": True, "other_revoked_keys": [],
         "certificates": {
             "/etc/ssh/ssh_host_ed25519_key-cert.pub": "ssh-ed25519-cert-v01@openssh.com AAAA...",
             ...},
         "drop_in": b"HostCertificate ...", "revoked_keys": b"SSHKRL...",
         "client_includes_drop_ins": True, "other_revoked_host_keys": [],
         "client_drop_in": b"Host *..."}
    """

    def command(self) -> StringCommand:
        return shell(
            _SSHD_SCRIPT,
            SSHD_MAIN_CONF,
            SSHD_MESH_CONF,
            REVOKED_KEYS,
            SSH_MAIN_CONF,
            SSH_MESH_CONF,
            *_HOST_CERT_PATHS,
        )

    def process(self, output: list[str]) -> SshdMeshT:
        head = [line for line in output if not line.startswith("file ")]
        files = read_file_lines(output)
        if (
            not any(line.startswith("include ") for line in head)
            or not any(line.startswith("client_include ") for line in head)
            or not {"drop_in", "krl", "client_drop_in", *_HOST_CERT_PATHS} <= files.keys()
        ):
            raise FactProcessError("sshd's files could not be read")
        return {
            "includes_drop_ins": "include yes" in head,
            "other_revoked_keys": [
                line.split(" ", 1)[1] for line in head if line.startswith("revoked_keys_in ")
            ],
            "certificates": {path: first_line(files[path]) for path in _HOST_CERT_PATHS},
            "drop_in": files["drop_in"]["data"] if files["drop_in"]["state"] == "regular" else None,
            "revoked_keys": files["krl"]["data"] if files["krl"]["state"] == "regular" else None,
            "client_includes_drop_ins": "client_include yes" in head,
            "other_revoked_host_keys": [
                line.split(" ", 1)[1] for line in head if line.startswith("revoked_host_keys_in ")
            ],
            "client_drop_in": (
                files["client_drop_in"]["data"]
                if files["client_drop_in"]["state"] == "regular"
                else None
            ),
        }

    def answer(self, value: dict[str, Any], recorded: list[str]) -> list[str]:
        """What the script prints on a node holding ``value``'s files and settings (the
        controller benchmark's converged node: all of it is the plan's, ``recorded`` unused)."""

        def yes(key: str) -> str:
            return "yes" if value[key] else "no"

        return [
            f"include {yes('includes_drop_ins')}",
            *(f"revoked_keys_in {path}" for path in value["other_revoked_keys"]),
            f"client_include {yes('client_includes_drop_ins')}",
            *(f"revoked_host_keys_in {path}" for path in value["other_revoked_host_keys"]),
            file_line("drop_in", value["drop_in"]),
            file_line("krl", value["revoked_keys"]),
            file_line("client_drop_in", value["client_drop_in"]),
            *(file_line(path, value["certificates"].get(path)) for path in _HOST_CERT_PATHS),
        ]


# Probe every peer as the mesh user: BatchMode (no password prompt), host keys checked
# strictly, a bounded number at once, each starting at a different peer so no node is
# hit by every other node at the same moment.
_PROBE_SCRIPT = script("ssh_mesh_probe.sh")


# The probe as a mesh user: su without -l, so the user's profile (the user's code) never runs
# in it; from a fixed environment, never root's (su adds the node's PAM one: /etc/environment).
_AS_MESH_USER = USER_ENV_FN + 'tf_user_env "$1" su -s /bin/sh "$1" -c "$2"\n'


class SshMeshProof(FactBase[dict[str, str]]):
    """
    Proof of the mesh from this node: ``ssh`` to every peer by name, as the mesh user,
    with host keys verified and no prompts. Returns ``{peer: "ok" | reason}``.

    + user: the mesh user to probe as
    + peers: peer names in the order to probe them (a list, or comma-separated on the CLI:
      ``pyinfra INVENTORY fact facts.ssh_mesh_facts.SshMeshProof user=root peers=gpu-a01,gpu-a02``)

    .. code:: python

        {"gpu-a02": "ok", "gpu-a03": "rc=255 Host key verification failed."}
    """

    def command(self, user: str, peers: list[str] | str) -> StringCommand:
        if isinstance(peers, str):
            peers = [p for p in peers.split(",") if p]
        probe = shell(_PROBE_SCRIPT, MESH_PROBE_PARALLEL, MESH_PROBE_TIMEOUT, *peers)
        self.peers = list(peers)
        if user == "root":
            return probe
        return shell(_AS_MESH_USER, user, probe.get_raw_value())

    def process(self, output: list[str]) -> dict[str, str]:
        peers = getattr(self, "peers", [])
        if not any(line.startswith("probing ") for line in output):
            # The probe did not run (the user's shell failed, su refused): nothing was proven.
            return {peer: "not probed" for peer in peers}
        results = {peer: "no answer" for peer in peers}
        for line in output:
            status, _, rest = line.partition(" ")
            peer, _, reason = rest.partition(" ")
            if peer not in results:
                continue
            if status == "ok":
                results[peer] = "ok"
            elif status == "fail":
                results[peer] = reason.strip() or "failed"
        return results

    @staticmethod
    def default() -> dict[str, str]:
        return {}

    def answer(self, value: dict[str, str], recorded: list[str]) -> list[str]:
        """What the probe prints where each peer it was asked for (``command``'s; else
        ``value``'s) answered as ``value`` says: ``ok``, a failure's reason, or nothing (no
        answer). Nothing at all where no peer was probed. ``recorded`` is unused: a proof is
        the run's, never a node's to keep."""
        peers = getattr(self, "peers", list(value))
        if value and all(result == "not probed" for result in value.values()):
            return []
        lines = [f"probing {len(peers)}"]
        for peer in peers:
            result = value.get(peer, "no answer")
            if result == "ok":
                lines.append(f"ok {peer} ")
            elif result != "no answer":
                lines.append(f"fail {peer} {result}")
        return lines
