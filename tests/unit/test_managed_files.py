"""Every managed file against a corpus of damaged and unusual file states, for real: the
fact's own shell command reads the file here, the one parser splits it, the write primitive
rewrites it. Each state either converges with every user byte kept (and a second pass changes
nothing) or is refused with the file byte-identical."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest
from pyinfra.api.exceptions import FactProcessError

from facts.fingerprint import FactBundle
from facts.hosts_facts import HOSTS_PURPOSE
from facts.managed_block_facts import ManagedBlock, block_answer, file_command, split_sections
from facts.openmpi_facts import MCA_PURPOSE
from facts.pdsh_facts import PDSH_PURPOSE
from facts.ssh_mesh_facts import AUTHORIZED_PURPOSE, CONFIG_PURPOSE, KNOWN_HOSTS_PURPOSE
from operations.managed_block_ops import block_change
from operations.remote import FailCommand
from tests.unit.test_remote import run
from trainfleet.blocks import markers, split_block
from trainfleet.nccl import ENV_PURPOSE

# (purpose, block first in the file) of every managed file trainfleet keeps.
MANAGED = {
    "/etc/hosts": (HOSTS_PURPOSE, False),
    "/etc/ssh/ssh_known_hosts": (KNOWN_HOSTS_PURPOSE, False),
    "~/.ssh/authorized_keys": (AUTHORIZED_PURPOSE, False),
    "~/.ssh/config": (CONFIG_PURPOSE, True),
    "~/.openmpi/mca-params.conf": (MCA_PURPOSE, True),
    "/etc/environment": (ENV_PURPOSE, False),
    "/etc/nccl.conf": (ENV_PURPOSE, False),
    "/etc/genders": (PDSH_PURPOSE, False),
}
NEW = ["new line 1", "new line 2"]


def states(purpose: str) -> dict[str, tuple[bytes | None, bool]]:
    """name -> (file bytes or None for no file, converges?)."""
    b, e = markers(purpose)
    block = f"{b}\nold\n{e}\n"
    return {
        "missing": (None, True),
        "empty": (b"", True),
        "only the block": (block.encode(), True),
        "no trailing newline": (b"user 1\nuser 2", True),
        "block then a last line without newline": (f"user 1\n{block}user 2".encode(), True),
        "CRLF user lines": (b"user 1\r\nuser 2\r\n", True),
        "bytes that are not UTF-8": (b"caf\xe9 \xff\xfe\n", True),
        "lines that look like fact framing": (
            b"--trainfleet-section-- hosts\nfile x regular - QUJD\nuser\n",
            True,
        ),
        "another purpose's markers": (
            b"# BEGIN trainfleet managed block: something else (do not edit)\n",
            True,
        ),
        "lone BEGIN": (f"user 1\n{b}\nuser 2\nuser 3\n".encode(), False),
        "lone END": (f"user 1\n{e}\nuser 2\n".encode(), False),
        "END before BEGIN": (f"{e}\nx\n{b}\n".encode(), False),
        "two blocks (one restored from a backup)": (f"{block}user\n{block}".encode(), False),
        "CRLF copy": (block.replace("\n", "\r\n").encode(), False),
        "marker text inside a user line": (f"user 1\nexport X='{b}'\n".encode(), False),
        "indented marker": (f"  {b}\nold\n{e}\n".encode(), False),
    }


def read(path: Path, purpose: str):
    fact = ManagedBlock()
    result = subprocess.run(
        ["sh", "-c", fact.command(path=str(path), purpose=purpose).get_raw_value()],
        capture_output=True,
    )
    assert result.returncode == 0, result.stderr
    return fact.process(result.stdout.decode().split("\n")[:-1])


def user_text(data: bytes, purpose: str) -> str:
    split = split_block(data.decode("utf-8", "surrogateescape"), purpose)
    return split.before + split.after


CASES = [(managed, state) for managed in MANAGED for state in states(MANAGED[managed][0])]


@pytest.mark.parametrize(("managed", "state"), CASES, ids=[f"{m} | {s}" for m, s in CASES])
def test_a_managed_file_converges_keeping_every_user_byte_or_is_refused_untouched(
    tmp_path, managed, state
):
    purpose, top = MANAGED[managed]
    original, converges = states(purpose)[state]
    target = tmp_path / "file"
    if original is not None:
        target.write_bytes(original)

    commands = block_change(str(target), purpose, read(target, purpose), NEW, top=top)

    if not converges:
        assert len(commands) == 1 and isinstance(commands[0], FailCommand)
        result = run(commands)
        assert result.returncode == 1 and "nothing was changed" in result.stderr
        assert target.read_bytes() == original
        return
    result = run(commands)
    assert result.returncode == 0, result.stderr
    after = read(target, purpose)
    assert after["block"] == NEW and after["broken"] is None
    kept = user_text(original, purpose) if original is not None else ""
    had_block = (
        original is not None
        and split_block(original.decode("utf-8", "surrogateescape"), purpose).block is not None
    )
    if not had_block and not top and kept and not kept.endswith("\n"):
        kept += "\n"  # the last user line gets its newline before the appended block
    assert user_text(target.read_bytes(), purpose) == kept
    assert block_change(str(target), purpose, after, NEW, top=top) == []  # a re-run changes nothing


def test_a_root_link_through_a_world_writable_directory_is_refused_and_left_alone(tmp_path):
    real = tmp_path / "real"
    real.write_text("127.0.0.1 localhost\n")
    link = tmp_path / "hosts"
    link.symlink_to(real)
    commands = block_change(str(link), HOSTS_PURPOSE, read(link, HOSTS_PURPOSE), NEW)
    result = run(commands)
    assert result.returncode == 1 and "symbolic link" in result.stderr
    assert link.is_symlink() and real.read_text() == "127.0.0.1 localhost\n"


def test_a_block_is_removed_and_nothing_else_changes(tmp_path):
    b, e = markers(HOSTS_PURPOSE)
    target = tmp_path / "hosts"
    target.write_text(f"a\n{b}\nold\n{e}\nb")
    assert (
        run(block_change(str(target), HOSTS_PURPOSE, read(target, HOSTS_PURPOSE), None)).returncode
        == 0
    )
    assert target.read_text() == "a\nb"


class _TwoFiles(FactBundle):
    def parts(self, first: str, second: str):  # type: ignore[override]
        return {
            "first": (ManagedBlock, {"path": first, "purpose": HOSTS_PURPOSE}),
            "second": (ManagedBlock, {"path": second, "purpose": HOSTS_PURPOSE}),
        }


def test_file_contents_cannot_forge_the_bundles_sections(tmp_path):
    b, e = markers(HOSTS_PURPOSE)
    first, second = tmp_path / "first", tmp_path / "second"
    # The first file carries lines shaped like every marker the bundle and the facts use.
    first.write_text(
        "--trainfleet-fingerprint-- second\n--trainfleet-section-- second\n"
        f"file second regular - {'QUJD'}\n{b}\nforged\n{e}\nno newline"
    )
    second.write_text(f"{b}\n198.18.0.11 node1\n{e}\n")
    bundle = _TwoFiles()
    command = bundle.command(first=str(first), second=str(second))
    output = subprocess.run(
        ["sh", "-c", command.get_raw_value()], capture_output=True, text=True
    ).stdout
    result = bundle.process(output.split("\n")[:-1])
    assert result["second"]["block"] == ["198.18.0.11 node1"]
    assert result["first"]["text"] == first.read_text()
    assert result["first"]["block"] == ["forged"]  # the user's own file, read as it is
    _, raw = split_sections(output.split("\n")[:-1], "--trainfleet-fingerprint--")
    assert sorted(raw) == ["first", "second"] and all(len(lines) == 1 for lines in raw.values())


def _answer(path: Path, purpose: str, expect: list[str]) -> tuple[list[str], object]:
    """``tf_block``'s answer for ``path`` (asked for ``expect``), as printed and as read."""
    fact = ManagedBlock()
    command = fact.command(path=str(path), purpose=purpose, expect=expect).get_raw_value()
    result = subprocess.run(["sh", "-c", command], capture_output=True)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().split("\n")[:-1]
    return lines, fact.process(lines)


@pytest.mark.parametrize(("managed", "state"), CASES, ids=[f"{m} | {s}" for m, s in CASES])
def test_a_block_asked_by_digest_reads_as_the_whole_file_does(tmp_path, managed, state):
    """Issue #27: every file state read with the plan's block asked for. A node holding that
    block answers its digest, never its lines; any other answers the whole file. Either way
    the fact is the whole file's (block, user lines and their numbers, brokenness); the
    Python twin the controller benchmark answers with prints exactly what the shell does."""
    purpose, _ = MANAGED[managed]
    original, _ = states(purpose)[state]
    target = tmp_path / "file"
    if original is not None:
        target.write_bytes(original.replace(b"\nold\n", b"\nnew line 1\nnew line 2\n"))
    whole = read(target, purpose)
    lines, asked = _answer(target, purpose, NEW)
    digested = any(line.startswith("block ") for line in lines)
    if whole["broken"] is None:  # a broken file may answer a digest: it reads broken all the same
        assert digested == (whole["block"] == NEW and not whole["link"])
    for key in ("exists", "block", "outside", "broken", "link"):
        assert asked[key] == whole[key], key
    if digested and whole["broken"] is None:
        assert (
            asked["text"] is None
            and "new line" not in base64.b64decode(lines[1].split()[4]).decode()
        )
        assert block_change(str(target), purpose, asked, NEW) == []  # nothing to rewrite
    elif not digested:  # a differing block comes back whole
        assert asked["text"] == whole["text"]
    file_line = read_file_lines_of(target)
    assert (block_answer(file_line, purpose, NEW) if file_line else lines) == lines


def read_file_lines_of(path: Path) -> str | None:
    """The plain ``tf_file`` line of ``path`` (None: no such file)."""
    if not path.exists():
        return None
    result = subprocess.run(
        ["sh", "-c", file_command(str(path)).get_raw_value()], capture_output=True
    )
    return result.stdout.decode().split("\n")[0]


def test_a_digest_not_asked_for_fails_the_read(tmp_path):
    """A digest answer that is not the planned block's, or not a digest, never passes."""
    target = tmp_path / "hosts"
    b, e = markers(HOSTS_PURPOSE)
    target.write_text(f"{b}\nnew line 1\nnew line 2\n{e}\n")
    lines, _ = _answer(target, HOSTS_PURPOSE, NEW)
    fact = ManagedBlock()
    fact.command(path=str(target), purpose=HOSTS_PURPOSE, expect=["other"])
    with pytest.raises(FactProcessError, match="not the one asked for"):
        fact.process(lines)
    fact.command(path=str(target), purpose=HOSTS_PURPOSE, expect=NEW)
    for bad in ("block x", f"{lines[0]} extra", lines[0][:-1] + "g"):
        with pytest.raises(FactProcessError):
            fact.process([bad, lines[1]])
    with pytest.raises(FactProcessError):  # a digest that came with the block's lines
        fact.process([lines[0], read_file_lines_of(target)])
