"""The suite's shards: every lab module runs in exactly one, the torch lab's together, each lab
shard with its own namespace prefix and state; the runner's tally reads pytest's own output."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.lab.conftest import TORCH_MODULES
from tests.run_suite import SHARDS, _outcomes, slowest

REPO = Path(__file__).resolve().parents[2]
LAB_SHARDS = [shard for shard in SHARDS if any(p.startswith("tests/lab/") for p in shard.paths)]


def test_every_lab_module_runs_in_exactly_one_shard_and_the_unit_tests_in_one():
    lab_modules = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests/lab").glob("test_*.py"))
    sharded = sorted(path for shard in LAB_SHARDS for path in shard.paths)
    assert sharded == lab_modules
    assert [shard.paths for shard in SHARDS if shard not in LAB_SHARDS] == [("tests/unit",)]
    assert all((REPO / path).exists() for shard in SHARDS for path in shard.paths)


def test_the_torch_labs_modules_share_one_shard():
    # The torch lab is converged once per session and shared: its modules must stay together.
    (home,) = [s for s in LAB_SHARDS if {Path(p).name for p in s.paths} & set(TORCH_MODULES)]
    assert set(TORCH_MODULES) <= {Path(p).name for p in home.paths}


def test_each_lab_shard_has_its_own_state_prefix_and_namespace():
    from lab import netns

    states = [shard.env.get("TRAINFLEET_LAB_DIR", str(netns.STATE_DIR)) for shard in LAB_SHARDS]
    prefixes = [shard.env.get("TRAINFLEET_LAB_PREFIX", netns.PREFIX) for shard in LAB_SHARDS]
    assert len(set(states)) == len(states) == len(set(prefixes))
    # One lab's teardown matches namespaces by prefix: no prefix may be the start of another's.
    assert not [(a, b) for a in prefixes for b in prefixes if a != b and b.startswith(a)]
    assert all(re.fullmatch(r"[a-z][a-z0-9]{0,6}-", prefix) for prefix in prefixes)
    # Only the first lab shard runs in this machine's namespace; the runner's own namespaces
    # are not under any lab's prefix, so no lab's teardown removes them.
    controllers = [shard.netns for shard in LAB_SHARDS]
    assert controllers.count(None) == 1 and len(set(controllers)) == len(controllers)
    assert not [n for n in controllers if n and any(n.startswith(p) for p in prefixes)]


def test_the_tally_and_the_slowest_tests_come_from_pytests_own_output(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        textwrap.dedent("""\
        import time, pytest

        def test_slow():
            time.sleep(0.3)

        def test_fails():
            assert False

        @pytest.mark.skip(reason="shown")
        def test_skipped():
            pass
        """)
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=5"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1
    assert _outcomes(run.stdout) == {"passed": 1, "failed": 1, "skipped": 1}
    (first, *_) = slowest({"sample": run.stdout})
    seconds, phase, test, shard = first.split()
    assert (phase, test.endswith("test_sample.py::test_slow"), shard) == ("call", True, "[sample]")
    assert float(seconds.rstrip("s")) >= 0.3
    assert _outcomes("") == {}  # a shard that printed no closing line counts nothing


def test_only_the_unit_tests_wait_for_a_first_shard_to_end():
    # Deferred shards start when another ends: a lab shard among them would lengthen the suite,
    # and with every shard deferred none would ever start.
    assert [shard.paths for shard in SHARDS if shard.deferred] == [("tests/unit",)]
    assert all(not shard.deferred for shard in LAB_SHARDS)
