"""The controller made ready for a large inventory: open files raised, every host at once."""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap

from runtime.controller import parallel_hosts

RAISE = textwrap.dedent("""
    import resource, sys
    from runtime.controller import raise_open_files
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))
    print(raise_open_files(int(sys.argv[3])), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
""")


def limits_after(soft: int, hard: int, hosts: int) -> list[int]:
    out = subprocess.run(
        [sys.executable, "-c", RAISE, str(soft), str(hard), str(hosts)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [int(v) for v in out.split()]


def test_the_soft_open_file_limit_is_raised_to_what_the_hosts_need_never_past_the_hard_one():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    hard = 4096 if hard == resource.RLIM_INFINITY or hard > 4096 else hard
    assert limits_after(256, hard, 500) == [min(hard, 1564)] * 2
    assert limits_after(256, 512, 500) == [512, 512]  # only root raises the hard limit
    assert limits_after(256, hard, 10) == [256, 256]  # enough already: left as it is


def test_every_host_runs_at_once_as_far_as_open_files_allow():
    assert parallel_hosts(500, 1564) == 500
    assert parallel_hosts(500, 1024) == 320
    assert parallel_hosts(3, 1024) == 3
    assert parallel_hosts(500, 10) == 1


def test_pyinfra_gets_the_parallelism_unless_the_user_chose_one(tmp_path):
    inventory = tmp_path / "big.py"
    inventory.write_text(
        textwrap.dedent("""
        from pyinfra import config
        from runtime.controller import configure_pyinfra
        configure_pyinfra(700)
        print("PARALLEL", config.PARALLEL)
        hosts = ["@local"]
    """)
    )
    pyinfra = str(__import__("pathlib").Path(sys.executable).with_name("pyinfra"))
    chosen = subprocess.run(
        [pyinfra, str(inventory), "debug-inventory"], capture_output=True, text=True, timeout=60
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    files = soft if soft >= 2164 else (2164 if hard == resource.RLIM_INFINITY else min(hard, 2164))
    assert f"PARALLEL {parallel_hosts(700, files)}" in chosen.stdout, (
        chosen.stderr
    )  # 700 unless the hard limit binds
    given = subprocess.run(
        [pyinfra, "--parallel", "5", str(inventory), "debug-inventory"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "PARALLEL 5" in given.stdout + given.stderr
