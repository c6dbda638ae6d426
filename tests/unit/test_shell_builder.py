"""One shell-command builder (facts/shell.py ``shell``): every ``sh -c`` a node runs is built
there, its script one quoted word and each value a quoted positional argument."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from facts.managed_block_facts import ManagedBlock, file_command
from facts.pdsh_facts import PdshState
from facts.shell import NAME, shell
from operations.stack_repo_ops import keyring_install

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("trainfleet", "facts", "runtime", "operations", "checks", "deploy")
# "sh", "-c" as words of a command built by hand (a StringCommand or an argv)
HAND_BUILT = re.compile(r"""["']sh["'],\s*["']-c["']""")
# The one builder; and ColossalAI's runner's local commands, which it hands over as shell text
# already (trainfleet/launch/colossalai_run.py runs them on the controller as an argv).
ALLOWED = {Path("facts/shell.py"), Path("trainfleet/launch/colossalai_run.py")}


def test_no_sh_c_is_built_by_hand_outside_the_builder():
    found = [
        f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
        for folder in PRODUCT
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.relative_to(ROOT) not in ALLOWED
        for text in [path.read_text(encoding="utf-8")]
        for m in HAND_BUILT.finditer(text)
    ]
    assert found == [], "build the command with facts.shell.shell"


def test_the_guard_sees_a_hand_built_command():
    assert HAND_BUILT.search('StringCommand(\n    "sh",\n    "-c",\n    QuoteString(x))')


def test_a_value_reaches_the_script_as_one_argument_whatever_it_holds():
    """The real sh: a value holding quotes, a command separator, a newline and a glob is
    ``$1`` as it was, and nothing of it ran."""
    value = "a'b\"c; echo ran $(id) `id`\n* $HOME"
    command = shell('printf "%s|%s" "$0" "$1"', value)
    out = subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True, text=True)
    assert out.stdout == f"{NAME}|{value}"


def test_the_commands_routed_through_the_builder_keep_their_words():
    """The four commands that built ``sh -c`` by hand keep their text (the pdsh and remediation
    fixtures pin whole commands): the script, ``trainfleet`` as $0, then the values, quoted
    only where they need it (paths and a URL scheme stay bare words)."""
    begin = "'# BEGIN trainfleet managed block: {} (do not edit)'"
    assert file_command("/etc/hosts").get_raw_value().endswith("' trainfleet /etc/hosts")
    block = ManagedBlock().command("/etc/hosts", "cluster hosts", ["192.0.2.11 a"])
    assert f"' trainfleet /etc/hosts {begin.format('cluster hosts')} " in block.get_raw_value()
    pdsh = PdshState().command(genders=None, machines=None).get_raw_value()
    assert (
        "' trainfleet /etc/pdsh/rcmd_default /etc/profile.d/trainfleet-pdsh.sh /etc/genders "
        + begin.format("pdsh nodes")
    ) in pdsh
    keyring = keyring_install("https://example.com/k ey.deb", "EB69").get_raw_value()
    assert keyring.startswith("sh -c '")
    assert keyring.endswith("' trainfleet 'https://example.com/k ey.deb' EB69 https")
