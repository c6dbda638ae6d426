"""The bandwidth and isolation pairs' rendezvous: which listener holds a pair's port (the real
hygiene script and the real ss over real sockets), an ss that listed nothing, a run whose pairs
never ran, a host that could not serve its pair, a pair store an intruder connected to."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyinfra.api import StringCommand

from checks import bandwidth_stage, collective_stage, preflight_check, rank_output
from checks.hygiene_output import parse_hygiene
from checks.hygiene_verdicts import pair_port_problems, port_listing_problems
from checks.preflight_report import PreflightReport
from checks.stage_runner import shell_stage, stage_script
from trainfleet import stamps
from trainfleet.spec import parse_cluster

LAB = parse_cluster(
    "nodes:\n  - {name: node1, address: 198.18.0.11}\n  - {name: node2, address: 198.18.0.12}\n"
    "  - {name: node3, address: 198.18.0.13}\n"
)
NODES = ["node1", "node2", "node3"]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hardware" / "h100_preflight"


def _hygiene(pairs: str, address: str, is_master: int = 0, path: str | None = None) -> list[str]:
    """The real hygiene script's output on this machine."""
    command = shell_stage(
        stage_script("hygiene.sh"), 1, is_master, "node1", "/nonexistent", "x", pairs, address, ""
    )
    env = os.environ | ({"PATH": path} if path else {})
    return subprocess.run(
        ["sh", "-c", command.get_raw_value()], capture_output=True, text=True, timeout=30, env=env
    ).stdout.splitlines()


def _listening(address: str, family: int = socket.AF_INET) -> socket.socket:
    held = socket.socket(family)
    held.bind((address, 0))
    held.listen()
    return held


# ---- finding 3: only a listener the pair store's bind would meet holds its port ---------------


def test_a_pair_port_is_held_only_on_the_nodes_address_or_every_address_not_on_loopback():
    """Real sockets, the real ss: 127.0.0.2 stands for the node's cluster address."""
    held = {
        "loopback": _listening("127.0.0.1"),
        "another address": _listening("127.0.0.3"),
        "the node's address": _listening("127.0.0.2"),
        "every address": _listening("0.0.0.0"),
    }
    if socket.has_ipv6:
        try:
            held["every address, v6"] = _listening("::", socket.AF_INET6)
        except OSError:
            pass  # no IPv6 here: the IPv4 wildcard stands for both
    try:
        ports = {why: s.getsockname()[1] for why, s in held.items()}
        seen = parse_hygiene(_hygiene(" ".join(map(str, ports.values())), "127.0.0.2"))
    finally:
        for s in held.values():
            s.close()
    holders = seen.get("pair_port_holders", {})
    assert sorted(holders) == sorted(
        port for why, port in ports.items() if why not in ("loopback", "another address")
    )
    assert all(h.startswith('users:(("python') for h in holders.values())
    hosted = {"node1": {port: f"the pair on {why}" for why, port in ports.items()}}
    named = [p.cause for p in pair_port_problems({"node1": seen}, hosted)]
    assert len(named) == len(holders) and not any(
        f"port {ports[why]}," in cause for cause in named for why in ("loopback", "another address")
    )


def test_a_run_whose_pairs_did_not_run_for_a_held_port_stamps_nobody_passed():
    """The collective passed, nobody else is named, but node2 holds a pair's port: no pair ran,
    so the others' verdict stays open (never carried over), and none is left out."""
    report = PreflightReport(cluster="lab", nodes=NODES)
    report.stages["collective"] = "ok"
    report.healthy = {"nodes": NODES, "excluded": {}, "multiple_of": None, "note": None}
    report.details["hygiene"] = {"node2": {"pair_port_holders": {29502: 'users:(("nc",pid=7))'}}}
    assert preflight_check.complete(report, LAB) is False
    now = datetime.now(UTC)
    after = stamps.recorded({}, {n: [] for n in NODES}, {}, NODES, now, complete=False)
    assert {n: s["passed"] for n, s in after.items()} == dict.fromkeys(NODES)
    # the same run without the holder (or one on a port no pair of it uses) is complete
    report.details["hygiene"] = {"node3": {"pair_port_holders": {29502: 'users:(("nc",pid=7))'}}}
    assert preflight_check.complete(report, LAB) is True


# ---- finding 7: an ss that listed nothing is no "no holder" -----------------------------------


def _path_without_ss(tmp_path: Path) -> str:
    """A PATH with every command of this machine but ss."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for d in os.environ["PATH"].split(":"):
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            if name != "ss" and not (bin_dir / name).exists():
                (bin_dir / name).symlink_to(os.path.join(d, name))
    return str(bin_dir)


def test_a_node_whose_ss_is_missing_or_fails_is_named_never_passed_as_having_no_holder(tmp_path):
    no_ss = _path_without_ss(tmp_path)
    failing = tmp_path / "failing"
    failing.mkdir()
    (failing / "ss").write_text("#!/bin/sh\nexit 1\n")  # ss that fails (no netlink, say)
    (failing / "ss").chmod(0o755)
    hosted = {"node1": {29501: "the bandwidth pair node1-node2"}, "node2": {}, "node3": {}}
    for path in (no_ss, f"{failing}:{os.environ['PATH']}"):
        for pairs, is_master in (("29501", 0), ("", 1)):  # a pair's host; the master
            seen = parse_hygiene(_hygiene(pairs, "127.0.0.2", is_master, path))
            assert seen.get("ports_unlisted") is True
            assert "port_holder" not in seen and "pair_port_holders" not in seen
            found = port_listing_problems(LAB, {"node1": seen}, hosted)
            assert [(p.node, p.cause) for p in found] == [
                ("node1", "cannot list listening ports: ss missing or failed")
            ]
    # with ss there, nothing of the kind
    assert "ports_unlisted" not in parse_hygiene(_hygiene("29501", "127.0.0.2", 1))


# ---- the pairs' own output (real rank lines, one line changed where said) ----------------------


def _real_pair_lines() -> list[str]:
    """gloo-pair-missing-peer-then-next: one rank's real output over three jobs, the second a
    pair whose peer never came (timed out), the third a pair that passed with a figure."""
    return (FIXTURES / "gloo-pair-missing-peer-then-next.out").read_text().splitlines()


def _job(lines: list[str], job: int, rank: int, as_job: int) -> list[str]:
    """The lines of one job of the real output, as job ``as_job`` of global rank ``rank``."""
    picked = []
    for line in lines:
        local, _, text = line.partition(" ")
        try:
            step = json.loads(text)
        except json.JSONDecodeError:
            continue
        if step.get("job") == job:
            step["job"] = as_job
            if "rank" in step:
                step["rank"] = rank
            picked.append(f"{local} {json.dumps(step)}")
    return picked


def _never_reached(job: int) -> list[str]:
    """A joining rank that reached no store, as collective.py prints it."""
    return [
        f'0 {{"step": "start", "job": {job}, "rank": 1, "local": 0, "gpu": null}}',
        f'0 {{"step": "timeout", "job": {job}, "stage": "rendezvous", "reached": false}}',
    ]


def _bandwidth_ranks(node1_job1: list[str], node2_job1: list[str]) -> dict:
    """The ring of three: (node1, node2) is job 1 of both, (node2, node3) job 2 of node2 and
    job 1 of node3, (node1, node3) job 2 of both; every pair but the first passed (the real
    passing pair's lines)."""
    real = _real_pair_lines()
    collective = _job(real, 0, 0, 0)
    passed = {(job, rank): _job(real, 2, rank, job) for job in (1, 2) for rank in (0, 1)}
    out = {
        "node1": collective + node1_job1 + passed[(2, 0)],
        "node2": collective + node2_job1 + passed[(2, 0)],
        "node3": collective + passed[(1, 1)] + passed[(2, 1)],
    }
    return {
        node: [rank_output.job_steps(r, 3) for r in rank_output.node_steps(lines, 1)]
        for node, lines in out.items()
    }


def _judged(ranks: dict, monkeypatch) -> PreflightReport:
    monkeypatch.setattr(bandwidth_stage, "read_error_counters", lambda state, nodes: {})
    report = PreflightReport(cluster="lab", nodes=NODES)
    bandwidth_stage.judge_bandwidth(None, LAB, report, ranks, {}, [])
    return report


def _timed_out_host(refused: int | None) -> list[str]:
    """The real job 1 (the host's rank timed out, its peer missing), with the store's count of
    connections it refused printed before that last step where ``refused`` is given."""
    job = _job(_real_pair_lines(), 1, 0, 1)
    store = (
        [f'0 {{"step": "store", "job": 1, "refused": {refused}}}'] if refused is not None else []
    )
    return job[:-1] + store + job[-1:]


def test_a_pair_that_failed_at_a_store_an_intruder_connected_to_names_every_node_alike(
    monkeypatch,
):
    report = _judged(_bandwidth_ranks(_timed_out_host(300), _never_reached(1)), monkeypatch)
    found = [(p.node, p.cause) for p in report.problems]
    assert [node for node, _ in found] == NODES
    assert len({cause for _, cause in found}) == 1
    assert "node1-node2" in found[0][1]
    assert "a process that does not hold the run's secret connected" in found[0][1]
    assert report.stages["bandwidth"] == "failed"
    # the pairs it did not touch are measured
    assert set(report.details["bandwidth"]["pairs"]) == {"node2-node3", "node1-node3"}
    # a store that refused nobody (or printed no count): the pair's own nodes are named
    for refused in (0, None):
        report = _judged(_bandwidth_ranks(_timed_out_host(refused), _never_reached(1)), monkeypatch)
        assert sorted({p.node for p in report.problems}) == ["node1", "node2"]
    # a count the store cannot have printed counts as an intruder
    bogus = _timed_out_host(0)
    bogus[-2] = bogus[-2].replace('"refused": 0', '"refused": -5')
    report = _judged(_bandwidth_ranks(bogus, _never_reached(1)), monkeypatch)
    assert [p.node for p in report.problems] == NODES


UNSERVED = "cannot serve the rendezvous on 198.18.0.11:{port}: [Errno 98] Address already in use"


def _unserved_host(job: int, port: int) -> list[str]:
    """The real job's start line, then the error collective.py prints when its store's bind
    failed (the one line changed: what it printed after its start)."""
    start = _job(_real_pair_lines(), 1, 0, job)[0]
    error = {"step": "error", "job": job, "stage": "store", "error": UNSERVED.format(port=port)}
    return [start, f"0 {json.dumps(error)}"]


def test_a_pair_whose_host_could_not_serve_its_rendezvous_names_the_host_alone(monkeypatch):
    report = _judged(_bandwidth_ranks(_unserved_host(1, 29501), _never_reached(1)), monkeypatch)
    assert [(p.node, p.cause) for p in report.problems] == [
        ("node1", "cannot serve the pair's rendezvous on 29501: [Errno 98] Address already in use")
    ]


# ---- isolation: the hosts' output is kept, and judged ------------------------------------------


def _isolation(monkeypatch, tmp_path, node1: dict[int, list[str]], node2: list[str]) -> tuple:
    """run_isolation's real commands run in a shell here, each rank standing in as a script that
    prints the given real-shaped lines: node1 hosts its pairs with node2 (``node1[0]``) and node3
    (``node1[1]``, passing); node2 never passes; in a second pass node3 hosts node2."""
    real = _real_pair_lines()
    ranks = {
        ("198.18.0.11", 29501, 0): node1[0],
        ("198.18.0.11", 29501, 1): node2,
        ("198.18.0.11", 29502, 0): node1[1],
        ("198.18.0.11", 29502, 1): _job(real, 2, 1, 0),
        ("198.18.0.13", 29501, 0): _job(real, 1, 0, 0),
        ("198.18.0.13", 29501, 1): node2,
    }
    sent: list[dict[str, str]] = []

    def command(first, count, world, master, port, backend, seconds, python):
        text = "\n".join(ranks[(master, port, first)])
        return StringCommand("sh", "-c", f"'read s; cat <<\"EOF\"\n{text}\nEOF\n'")

    def run_everywhere(state, commands, seconds, stdin=None):
        raws = {n: c.get_raw_value() for n, c in commands.items()}
        sent.append(raws)
        return {
            n: subprocess.run(
                ["sh", "-c", raw], input=f"{stdin}\n", capture_output=True, text=True, timeout=30
            ).stdout.splitlines()
            for n, raw in raws.items()
        }

    monkeypatch.setattr(collective_stage, "collective_command", command)
    monkeypatch.setattr(collective_stage, "run_everywhere", run_everywhere)
    monkeypatch.setattr(collective_stage, "RUN_DIR", str(tmp_path / "run"))
    report = PreflightReport(cluster="lab", nodes=NODES)
    collective_stage.run_isolation(None, LAB, report)
    return report, sent


def test_an_isolation_host_that_could_not_serve_names_itself_not_its_partner(monkeypatch, tmp_path):
    real = _real_pair_lines()
    node1 = {0: _unserved_host(0, 29501), 1: _job(real, 2, 0, 0)}
    report, sent = _isolation(monkeypatch, tmp_path, node1, _never_reached(0))
    # (the host's words come only from its own output: kept, not thrown away)
    assert [(p.node, p.stage, p.cause) for p in report.problems] == [
        (
            "node1",
            "isolation",
            "cannot serve the pair's rendezvous on 29501: [Errno 98] Address already in use",
        )
    ]
    assert len(sent) == 1  # no second pass: a host's port decided the pair
    assert list((tmp_path / "run").iterdir()) == []  # the hosts' private directory removed


def test_an_isolation_pair_that_failed_at_a_store_an_intruder_connected_to_names_no_one_node(
    monkeypatch, tmp_path
):
    real = _real_pair_lines()
    host = _job(real, 1, 0, 0)  # timed out, its peer missing
    host = host[:-1] + ['0 {"step": "store", "job": 0, "refused": 12}'] + host[-1:]
    report, _ = _isolation(
        monkeypatch, tmp_path, {0: host, 1: _job(real, 2, 0, 0)}, _never_reached(0)
    )
    found = [(p.node, p.stage, p.cause) for p in report.problems]
    assert [node for node, _, _ in found] == NODES and len({c for _, _, c in found}) == 1
    assert "a process that does not hold the run's secret connected" in found[0][2]
    # without the intruder, node2 is the one the isolation names (the verdict is still made)
    host = _job(real, 1, 0, 0)
    report, _ = _isolation(
        monkeypatch, tmp_path, {0: host, 1: _job(real, 2, 0, 0)}, _never_reached(0)
    )
    assert {p.node for p in report.problems} == {"node2"}


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
