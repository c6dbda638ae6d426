"""Stale System V shared memory: the fact's parser over the kernel's /proc/sysvipc/shm, and
the preflight's warning.

SYSVIPC mirrors the table as Linux 6.x prints it (ipc/shm.c sysvipc_shm_proc_show: the key
as a signed decimal, so keys above 0x7fffffff are negative), with an attached segment of a
desktop session, a 2 GiB segment a crashed job left behind, and an IPC_PRIVATE one.
"""

from __future__ import annotations

import subprocess

import pytest

from checks.hygiene_output import parse_hygiene
from checks.hygiene_verdicts import shm_warnings
from facts.shm_facts import StaleSharedMemory, parse_sysvipc_shm
from operations.shm_ops import remove_command

SYSVIPC = (
    "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid  "
    "    atime      dtime      ctime                   rss                  swap\n"
    "         0          3  1600               524288  2087  2511      2  1000  1000  1000  1000 "
    "1795360000 1795360100 1795359000                 45056                     0\n"
    "-1871639126      32769   600           2147483648 41233 41260      0     0     0     0     0 "
    "1795364000 1795364100 1795363000            2147483648                     0\n"
    "         0      32770   600                 4096 41233     0      0     0     0     0     0   "
    "       0          0 1795367590                     0                     0\n"
    "now 1795367700\n"
)


def test_only_segments_no_process_is_attached_to_are_stale():
    stale = parse_sysvipc_shm(SYSVIPC.splitlines())
    assert [s["shmid"] for s in stale] == [32769, 32770]
    crashed = stale[0]
    assert crashed["key"] == "0x90710daa"  # as `ipcs -m` prints it: the key's unsigned hex
    assert crashed["bytes"] == 2 * 1024**3 and crashed["owner_uid"] == 0
    assert crashed["idle_seconds"] == 1795367700 - 1795364100  # since its last detach
    assert stale[1]["idle_seconds"] == 110  # never attached: since it was created


def test_the_fact_runs_on_this_machine_and_finds_a_segment_it_made(tmp_path):
    # ipcmk creates a segment and exits: exactly the leftover the check is for. Removed by id.
    made = subprocess.run(
        ["ipcmk", "-M", "8192"], capture_output=True, text=True, check=True
    ).stdout
    shmid = int(made.split(":")[1])
    try:
        out = subprocess.run(
            ["sh", "-c", StaleSharedMemory().command()], capture_output=True, text=True
        ).stdout
        stale = StaleSharedMemory().process(out.splitlines())
        assert any(s["shmid"] == shmid and s["bytes"] == 8192 for s in stale)
    finally:
        subprocess.run(["ipcrm", "-m", str(shmid)], check=True)


def test_the_preflight_warns_per_node_and_says_how_to_remove_them():
    hygiene = {
        "node2": parse_hygiene([f"sysvipc {line}" for line in SYSVIPC.splitlines()]),
        "node1": parse_hygiene(["sysvipc " + SYSVIPC.splitlines()[0], "sysvipc now 1795367700"]),
    }
    (warning,) = shm_warnings(hygiene, "pyinfra -y inv.py deploy/shm_cleanup.py")
    assert warning.node == "node2" and warning.stage == "hygiene"
    assert str(warning).startswith(
        "hygiene: 2 stale System V shared memory segments (2.0 GiB) with no process"
    )
    assert (
        "shmid 32769 (2.0 GiB, idle 1 h)" in warning.cause
        and "shmid 32770 (4.0 KiB, idle 1 min)" in warning.cause
    )
    assert warning.cause.endswith("remove with: pyinfra -y inv.py deploy/shm_cleanup.py")


def test_rows_that_are_not_exactly_numbers_are_skipped_so_no_such_id_reaches_ipcrm():
    row = SYSVIPC.splitlines()[2]  # the crashed job's segment
    hostile = [
        row.replace("32769", "1;id", 1),
        row.replace("32769", "\u0663\u0662\u0667", 1),  # Arabic-Indic digits
        row.replace("32769", "\u00b3", 1),
        row.replace("32769", "99999999999", 1),
        row.replace(" 0 ", " x ", 1),
        "now 17953677OO",
    ]
    assert parse_sysvipc_shm(hostile) == []
    assert [s["shmid"] for s in parse_sysvipc_shm([*hostile, row])] == [32769]


def test_the_removal_command_takes_only_int_ids_quoted_and_its_script_refuses_anything_else(
    tmp_path,
):
    stale = parse_sysvipc_shm(SYSVIPC.splitlines())
    assert remove_command(stale).get_raw_value().endswith("' trainfleet 32769 32770")
    for bad in ("1; id", True, -1, 2**31):
        with pytest.raises(ValueError):
            remove_command([{**stale[0], "shmid": bad}])
    # The script checks again: what is not digits is refused, never run or passed to ipcrm.
    script = remove_command([]).get_raw_value()
    done = subprocess.run(
        ["sh", "-c", f"{script} '1;touch {tmp_path}/ran' '$(touch {tmp_path}/ran)'"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.splitlines() == [
        f"refused 1;touch {tmp_path}/ran (not a shmid)",
        f"refused $(touch {tmp_path}/ran) (not a shmid)",
    ]
    assert list(tmp_path.iterdir()) == []
