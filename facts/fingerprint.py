"""Several facts in one remote command (``FactBundle``), and the one table from the fact names
the capabilities give their bundle sections to the facts (``FACTS``).

The bundle composes facts (each keeps its own command and parser): their commands run one
after another in a single shell, each section marked, and each section's output goes to that
fact's own ``process``. One round trip per node. Which sections a run reads is the
run-time's (runtime/bundle.py loops over the capabilities' registry).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from pyinfra.api import FactBase, StringCommand
from pyinfra.api.exceptions import FactProcessError

from facts.gpu_node_facts import GpuNodeState
from facts.hardware_facts import HardwareState
from facts.hosts_facts import HOSTS_PURPOSE, HostnameState
from facts.launchers_facts import LauncherFiles
from facts.managed_block_facts import ManagedBlock, decode_lines, split_sections
from facts.nccl_env_facts import NcclEnvFiles, NcclEnvSeen, NcclNetwork
from facts.npu_facts import NpuDeviceIps
from facts.openmpi_facts import OpenMpiState
from facts.os_release_facts import OS_NAME_SH
from facts.pdsh_facts import PdshState
from facts.ssh_mesh_facts import (
    KNOWN_HOSTS_PURPOSE,
    SshdMesh,
    SshHostKeys,
    SshMeshProof,
    SshMeshUser,
)
from facts.stack_facts import StackVersions
from trainfleet.defaults import SYSTEM_KNOWN_HOSTS

_MARK = "--trainfleet-fingerprint--"

# Identity and hardware: what makes this machine this machine. GPU lines come from
# nvidia-smi's CSV query (absent on CPU nodes), bounded: a wedged GPU hangs nvidia-smi.
_IDENTITY = (
    r"""
echo "boot_id $(cat /proc/sys/kernel/random/boot_id 2>/dev/null)"
echo "machine_id $(cat /etc/machine-id 2>/dev/null)"
echo "kernel $(uname -r)"
"""
    + OS_NAME_SH
    + r"""
if command -v nvidia-smi >/dev/null 2>&1; then
  timeout -k 5 20 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu /'
fi
true
"""  # noqa: E501 (sent to nodes byte for byte)
)


class Identity(FactBase[dict[str, Any]]):
    """
    The machine's identity: boot_id, machine-id, kernel, OS, and its GPUs (model, driver).

    .. code:: python

        {"boot_id": "4b1c...", "machine_id": "a317...", "kernel": "6.8.0-45-generic",
         "os": "Ubuntu 22.04.4 LTS",
         "gpus": [{"name": "NVIDIA H100 80GB HBM3", "driver": "550.90.07"}]}
    """

    def command(self) -> str:
        return _IDENTITY

    def process(self, output: list[str]) -> dict[str, Any]:
        data: dict[str, Any] = {"gpus": []}
        for line in output:
            key, _, value = line.partition(" ")
            if key == "gpu":
                name, _, driver = value.rpartition(",")
                data["gpus"].append({"name": name.strip(), "driver": driver.strip()})
            else:
                data[key] = value.strip()
        return data

    def answer(self, value: dict[str, Any], recorded: list[str]) -> list[str]:
        """What the command prints on the node ``recorded`` holds once it has ``value``'s
        ids, kernel, OS and GPUs (each key ``value`` leaves out is the recorded one)."""
        lines = [
            f"{key} {value[key]}" if key in value else line
            for line in recorded
            if (key := line.partition(" ")[0]) != "gpu" or "gpus" not in value
        ]
        said = {line.partition(" ")[0] for line in lines}
        lines += [f"{key} {v}" for key, v in value.items() if key != "gpus" and key not in said]
        return lines + [f"gpu {gpu['name']}, {gpu['driver']}" for gpu in value.get("gpus", [])]


Parts = dict[str, tuple[type[FactBase], dict[str, Any]]]  # section -> (fact, its arguments)
Sections = dict[str, tuple[str, dict[str, Any]]]  # section -> (a fact's name in FACTS, arguments)

# The one table from the names the capabilities give their sections' facts (the core names
# facts, never imports them) to the fact and the arguments the name stands for.
FACTS: Mapping[str, tuple[type[FactBase], dict[str, Any]]] = MappingProxyType(
    {
        "Identity": (Identity, {}),
        "HostnameState": (HostnameState, {}),
        "HostsBlock": (ManagedBlock, {"path": "/etc/hosts", "purpose": HOSTS_PURPOSE}),
        "SshHostKeys": (SshHostKeys, {}),
        "SshdMesh": (SshdMesh, {}),
        "KnownHostsBlock": (
            ManagedBlock,
            {"path": SYSTEM_KNOWN_HOSTS, "purpose": KNOWN_HOSTS_PURPOSE},
        ),
        "SshMeshUser": (SshMeshUser, {}),
        "SshMeshProof": (SshMeshProof, {}),
        "PdshState": (PdshState, {}),
        "NcclNetwork": (NcclNetwork, {}),
        "NcclEnvFiles": (NcclEnvFiles, {}),
        "NcclEnvSeen": (NcclEnvSeen, {}),
        "LauncherFiles": (LauncherFiles, {}),
        "NpuDeviceIps": (NpuDeviceIps, {}),
        "StackVersions": (StackVersions, {}),
        "OpenMpiState": (OpenMpiState, {}),
        "GpuNodeState": (GpuNodeState, {}),
        "HardwareState": (HardwareState, {}),
    }
)


def resolve(sections: Sections) -> Parts:
    """A capability's sections with their facts; a fact name no fact answers to is an error
    (a capability naming a fact that was renamed or never written)."""
    parts: Parts = {}
    for section, (name, kwargs) in sections.items():
        if name not in FACTS:
            raise KeyError(f"section {section}: no fact is named {name!r} (facts/fingerprint.py)")
        fact, preset = FACTS[name]
        parts[section] = (fact, {**preset, **kwargs})
    return parts


class FactBundle(FactBase[dict[str, Any]]):
    """Several facts in one remote command: each fact's command runs in the same shell, its
    output marked, and goes to that fact's own ``process``. Subclasses name the parts."""

    def parts(self, **kwargs: Any) -> Parts:
        raise NotImplementedError

    def command(self, **kwargs: Any) -> StringCommand:
        self._facts: dict[str, FactBase] = {}
        pieces: list[Any] = []
        for name, (fact_cls, fact_kwargs) in self.parts(**kwargs).items():
            fact = fact_cls()
            self._facts[name] = fact
            command = fact.command(**fact_kwargs)
            if isinstance(command, str):
                command = StringCommand(command)
            # Each section's output travels as one base64 line: nothing a file or a user's
            # process prints inside it can end the section or forge another one.
            pieces += [
                "echo",
                f"'{_MARK} {name}';",
                "(",
                command,
                ")",
                "2>/dev/null",
                "|",
                "base64",
                "-w0;",
                "echo;",
            ]
        return StringCommand(*pieces, "true")

    def process(self, output: list[str]) -> dict[str, Any]:
        _, raw = split_sections(output, _MARK)
        result: dict[str, Any] = {}
        for name, fact in self._facts.items():
            encoded = raw.get(name)
            if encoded is None or len(encoded) != 1:
                raise FactProcessError(f"section {name}: missing or not one line")
            try:
                lines = decode_lines(encoded[0])
                # pyinfra gives an empty output the fact's default, not process([]); so do we.
                result[name] = fact.process(lines) if lines else fact.default()
            except Exception as exc:
                raise FactProcessError(
                    f"section {name}: cannot read what the node returned: {exc}"
                ) from exc
        return result
