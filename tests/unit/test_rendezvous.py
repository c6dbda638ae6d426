"""The collective's rendezvous is the ranks' own (issue #38): its secret reaches them on stdin
only, and its verdicts fail closed, never singling out one node on what the store said."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from checks import bandwidth_stage, collective_stage, collective_verdicts, rank_output, stage_runner
from checks.collective_verdicts import collective_problems
from checks.hygiene_output import parse_hygiene
from checks.hygiene_verdicts import pair_port_problems
from checks.pair_ports import hosted_ports
from checks.preflight_report import PreflightReport
from checks.stage_runner import shell_stage, stage_script
from trainfleet.spec import parse_cluster

LAB = parse_cluster(
    "nodes:\n  - {name: node1, address: 198.18.0.11}\n  - {name: node2, address: 198.18.0.12}\n"
    "  - {name: node3, address: 198.18.0.13}\n"
)
NODES = ["node1", "node2", "node3"]
SECRET = re.compile(r"[0-9a-f]{64}")


def started(rank: int) -> dict:
    return {"step": "start", "job": 0, "rank": rank}


def timed_out(joined: list, missing: list, count=None, **more) -> dict:
    """A rank's rendezvous timeout, as collective.py prints it."""
    view = {"step": "timeout", "job": 0, "stage": "rendezvous", "joined": joined}
    view |= {"missing": missing} | ({"count": count} if count is not None else {}) | more
    return view


def verdicts(steps: dict[str, list[dict]]) -> list[tuple[str, str]]:
    return [(p.node, p.cause) for p in collective_problems(LAB, {n: [s] for n, s in steps.items()})]


def every_node_alike(found: list[tuple[str, str]], why: str) -> None:
    assert [node for node, _ in found] == NODES, found
    assert len({cause for _, cause in found}) == 1, found  # one cause: nobody singled out
    assert why in found[0][1] and "every node is named alike" in found[0][1], found


def test_node3_that_never_joined_is_named_alone_from_the_ranks_own_view():
    found = verdicts(
        {
            "node1": [started(0), {"step": "reached"}, timed_out([0, 1], [2], count=2)],
            "node2": [started(1), {"step": "reached"}, timed_out([0, 1], [2], count=2)],
            "node3": [started(2)],
        }
    )
    assert found == [("node3", "never joined the rendezvous at node1:29500 (joined: node1, node2)")]


def test_a_rendezvous_that_timed_out_with_no_rank_missing_fails_every_node_alike():
    # (before #38: no problem at all, so a run whose counter a user held back passed)
    view = timed_out([0, 1, 2], [], count=2)
    found = verdicts({n: [started(r), view] for r, n in enumerate(NODES)})
    every_node_alike(found, "timed out though every rank had joined it")


@pytest.mark.parametrize("count", [-998, -1, 3, 4, 1000, "2", True, None])
def test_a_counter_the_ranks_cannot_have_left_fails_every_node_alike(count):
    # ranks set joined/<rank> before they add 1: the count lies between 0 and the ranks joined
    view = timed_out([0, 1], [2], count=count) | ({"count": None} if count is None else {})
    found = verdicts({"node1": [started(0), view], "node2": [started(1), view], "node3": []})
    every_node_alike(found, "ranks joined, not 0 to 2")


@pytest.mark.parametrize(
    ("joined", "missing"),
    [
        ([0, 1, 2, 7], [3]),  # a rank the job has not
        ([0, 0, 1], [2]),  # a rank twice
        ([0, 1], [1, 2]),  # joined and missing at once
        ([0], [2]),  # a rank neither joined nor missing
        ([0, "1"], [2]),  # not a rank at all
        ("0,1", [2]),
    ],
)
def test_a_view_that_is_not_the_jobs_ranks_each_once_fails_every_node_alike(joined, missing):
    view = timed_out(joined, missing, count=1)
    found = verdicts({"node1": [started(0), view], "node2": [started(1), view], "node3": []})
    every_node_alike(found, "reported ranks that are not the job's, or not each once")


def test_a_rank_listed_as_joined_that_never_started_fails_every_node_alike():
    # node3 has no venv (its own output says so): its joined/2 key appeared from nowhere
    view = timed_out([0, 2], [1], count=1)
    nopython = rank_output.node_steps(["nopython"], 1)[0]
    found = verdicts({"node1": [started(0), view], "node2": [started(1), view], "node3": nopython})
    every_node_alike(found, "lists rank 2 of node3 as joined, which never reached it")
    # likewise a rank that says itself it never reached the store
    unreached = {"step": "timeout", "job": 0, "stage": "rendezvous", "reached": False}
    found = verdicts(
        {"node1": [started(0), view], "node2": [started(1), view], "node3": [unreached]}
    )
    every_node_alike(found, "lists rank 2 of node3 as joined, which never reached it")


def test_a_store_that_could_not_prove_the_secret_fails_every_node_alike():
    impostor = {"step": "timeout", "stage": "rendezvous", "reached": False, "impostor": True}
    found = verdicts({"node1": [started(0)], "node2": [impostor], "node3": [impostor]})
    every_node_alike(found, "answered by a process that does not hold the run's secret")


def test_no_rank_reaching_the_store_names_the_masters_own_failure_or_every_node():
    unreached = {"step": "timeout", "job": 0, "stage": "rendezvous", "reached": False}
    bind = {
        "step": "error",
        "job": 0,
        "stage": "store",
        "error": "cannot serve the rendezvous on 198.18.0.11:29500: [Errno 98] Address in use",
    }
    found = verdicts({"node1": [started(0), bind], "node2": [unreached], "node3": [unreached]})
    assert found == [
        (
            "node1",
            "store failed: cannot serve the rendezvous on 198.18.0.11:29500: "
            "[Errno 98] Address in use",
        )
    ]
    found = verdicts({n: [unreached] for n in NODES})
    assert [n for n, _ in found] == NODES
    assert {c for _, c in found} == {
        "no rank reached the store of the rendezvous at node1:29500 in time"
    }


def test_an_all_alike_rendezvous_verdict_runs_no_isolation(monkeypatch):
    """Isolation would pair nodes up and name one: where the store's view was impossible, the
    verdict is the cluster's, and no pair test runs."""
    from checks import preflight_check

    ran: list[str] = []

    def run_everywhere(state, commands, seconds, stdin=None):
        ran.append(stdin or "")
        view = json.dumps(timed_out([0, 1, 2], [], count=1000))
        return {node: [f"0 {view}"] for node in commands}

    monkeypatch.setattr(collective_stage, "run_everywhere", run_everywhere)
    monkeypatch.setattr(preflight_check, "run_isolation", lambda *a: pytest.fail("isolation ran"))
    report = PreflightReport(cluster="lab", nodes=NODES)
    preflight_check._collective_stages(None, LAB, report, {}, set(NODES))
    assert len(ran) == 1 and report.stages["collective"] == "failed"
    assert [p.node for p in report.problems] == NODES


# ---- intruders at a store whose rendezvous failed: nobody is singled out ---------------------


def store_said(refused) -> dict:
    """What rank 0 prints just before its job's last step."""
    return {"step": "store", "job": 0, "refused": refused}


@pytest.mark.parametrize("refused", [0, 3])
def test_a_failed_rendezvous_whose_store_refused_connections_fails_every_node_alike(refused):
    """A flood timed to hold node3's rank back until the end: the store counted what it refused,
    and the late rank says nothing about node3."""
    view = timed_out([0, 1], [2], count=2)
    late = {"step": "timeout", "job": 0, "stage": "rendezvous", "reached": False}
    found = verdicts(
        {
            "node1": [started(0), {"step": "reached"}, store_said(refused), view],
            "node2": [started(1), {"step": "reached"}, view],
            "node3": [started(2), late],
        }
    )
    if refused:
        every_node_alike(found, "its store refused 3 connection(s) that were not the job's")
    else:
        assert found == [
            ("node3", "never joined the rendezvous at node1:29500 (joined: node1, node2)")
        ]


def test_a_collective_that_met_then_failed_on_its_own_is_judged_as_before_with_intruders():
    versions = [{"torch": "2.13.0+cpu"}, {"torch": "2.13.0+cpu"}, {"torch": "2.13.1+cpu"}]
    gathered = {"step": "all_gather", "job": 0, "versions": versions}
    summed = {"step": "all_reduce", "job": 0, "ok": True, "got": 6.0, "expected": 6.0}
    ranks = {
        n: [started(r), {"step": "joined", "job": 0}, summed, gathered]
        + ([store_said(40)] if r == 0 else [])
        + [{"step": "done", "job": 0}]
        for r, n in enumerate(NODES)
    }
    assert verdicts(ranks) == [
        ("node3", "torch 2.13.1+cpu differs from the other ranks' 2.13.0+cpu")
    ]
    assert not collective_verdicts.rendezvous_tampered(list(ranks.values()))


def test_the_pairs_side_reads_a_jobs_store_count_and_whether_its_rendezvous_was_tampered_with():
    """``store_refused`` and ``rendezvous_tampered``, as the bandwidth and isolation pairs call
    them with one job's ranks' steps."""
    host = [started(0), {"step": "reached", "job": 0}, store_said(4)]
    host += [timed_out([0], [1], count=1)]
    joiner = [started(1), {"step": "timeout", "job": 0, "stage": "rendezvous", "reached": False}]
    assert collective_verdicts.store_refused(host) == 4
    assert collective_verdicts.store_refused(joiner) is None  # only rank 0 says it
    assert collective_verdicts.rendezvous_tampered([host, joiner])
    assert collective_verdicts.rendezvous_tampered([joiner, host])  # in any order
    clean = [*host[:2], store_said(0), host[3]]
    assert not collective_verdicts.rendezvous_tampered([clean, joiner])
    # a rank cut off after it started, before it joined, fails the rendezvous too
    cut = [started(1), {"step": "reached", "job": 0}, {"step": "exit", "code": 124}]
    assert collective_verdicts.rendezvous_tampered([host, cut])
    # the host could not bind its port: no count, the host alone is named (as before)
    bind = [started(0), {"step": "error", "job": 0, "stage": "store", "error": "in use"}]
    assert collective_verdicts.store_refused(bind) is None
    assert not collective_verdicts.rendezvous_tampered([bind, joiner])
    # a count the ranks never print fails closed
    for odd in (-1, "3", None, True, 1.5):
        assert collective_verdicts.store_refused([store_said(odd)]) == 1
    # a pair that met, then summed wrongly: its own failure, not the store's
    wrong = {"step": "all_reduce", "job": 0, "ok": False, "got": 2.0, "expected": 3.0}
    met = [started(0), {"step": "joined", "job": 0}, wrong, store_said(9), {"step": "done"}]
    assert not collective_verdicts.rendezvous_tampered([met, met[:3] + met[4:]])


def test_a_rank_whose_all_reduce_gave_a_wrong_sum_failed_even_when_it_finished():
    """An isolation or bandwidth pair judged by ``rank_failure`` alone: a wrong sum fails it."""
    wrong = {"step": "all_reduce", "job": 0, "ok": False, "got": 2.0, "expected": 3.0}
    rank = [started(1), {"step": "joined", "job": 0}, wrong, {"step": "done", "job": 0}]
    assert collective_verdicts.rank_failure(rank) == "all_reduce gave 2.0, expected 3.0"
    right = wrong | {"ok": True, "got": 3.0}
    assert collective_verdicts.rank_failure([*rank[:2], right, rank[3]]) is None
    # the collective names it once, as before (no second problem for the same sum)
    steps = {n: [started(r), right, {"step": "done"}] for r, n in enumerate(NODES)}
    steps["node2"] = [started(1), wrong, {"step": "done"}]
    assert verdicts(steps) == [("node2", "all_reduce gave 2.0, expected 3.0")]


# ---- the secret: on stdin, never in a command line -------------------------------------------


def test_each_collective_and_pair_command_gets_a_fresh_secret_on_stdin_never_in_its_arguments(
    monkeypatch,
):
    sent: list[tuple[dict[str, str], str | None]] = []

    def run_everywhere(state, commands, seconds, stdin=None):
        sent.append(({n: c.get_raw_value() for n, c in commands.items()}, stdin))
        return {}

    monkeypatch.setattr(collective_stage, "run_everywhere", run_everywhere)
    report = PreflightReport(cluster="lab", nodes=NODES)
    collective_stage.run_collective(None, LAB, report, {})
    collective_stage.run_isolation(None, LAB, report)
    assert len(sent) == 3  # the collective, isolation's two passes
    secrets_sent = [stdin for _, stdin in sent]
    assert all(s and SECRET.fullmatch(s) for s in secrets_sent)
    assert len(set(secrets_sent)) == 3  # one per command, never reused
    for commands, secret in sent:
        assert not any(secret in raw for raw in commands.values())
    # node1 hosts both of the first pass's pairs: it reads the secret once, hands it to each
    hosting = sent[1][0]["node1"]
    assert hosting.startswith("IFS= read -r secret; ")
    assert hosting.count("printf '%s\\n' \"$secret\" |") == 2


def _stand_in_python(tmp_path) -> str:
    """A venv whose "python" reports the secret file the ranks read: its mode and content."""
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(
        "#!/bin/sh\nshift 3\n"  # -I -c SCRIPT
        'printf \'{"step": "start", "mode": "%s", "secret": "%s", "args": "%s"}\\n\' '
        '"$(stat -c %a secret)" "$(cat secret)" "$*"\n'
        'echo \'{"step": "done"}\'\n'
    )
    python.chmod(0o755)
    return str(tmp_path / "venv")


def test_the_secret_on_stdin_becomes_a_0600_file_only_the_ranks_read(tmp_path, monkeypatch):
    base = tmp_path / "run"
    monkeypatch.setattr(stage_runner, "RUN_DIR", str(base))
    venv = _stand_in_python(tmp_path)
    for module in (collective_stage, rank_output):
        monkeypatch.setattr(module, "VENV_PYTHON", f"{venv}/bin/python")
    command = collective_stage.collective_command(0, 2, 2, "127.0.0.1", 1, "gloo", 5)
    secret = secrets.token_hex(32)

    def run(stdin: str) -> list[list[dict]]:
        done = subprocess.run(
            ["sh", "-c", command.get_raw_value()],
            cwd=tmp_path,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=30,
            env=dict(os.environ),
        )
        return rank_output.node_steps(done.stdout.splitlines(), 2)

    ranks = run(secret + "\n")
    for rank in ranks:
        start = rank[0]
        assert (start["mode"], start["secret"]) == ("600", secret)
        assert secret not in start["args"]
    assert list(base.iterdir()) == []  # removed with the private directory
    # no secret (or a line that is not one): every rank fails before the network, named
    for stdin in ("", "\n", "not hex; rm -rf /\n"):
        ranks = run(stdin)
        assert [r[0] for r in ranks] == [
            {"step": "error", "stage": "secret", "error": "no rendezvous secret came on stdin"}
        ] * 2


def test_run_everywhere_hands_the_secret_to_pyinfra_as_stdin_not_in_the_command():
    got: dict[str, dict] = {}

    class Host:
        def __init__(self, name: str):
            self.name, self.data = name, SimpleNamespace(trainfleet_node=name, get=lambda k: None)

        def run_shell_command(self, command, **kwargs):
            got[self.name] = {"command": command.get_raw_value(), **kwargs}
            return True, SimpleNamespace(stdout_lines=["ok"])

    hosts = [Host(n) for n in NODES]
    state = SimpleNamespace(inventory=SimpleNamespace(get_active_hosts=lambda: hosts))
    secret = secrets.token_hex(32)
    commands = {n: stage_runner.shell_stage("cat >/dev/null") for n in NODES}
    assert stage_runner.run_everywhere(state, commands, 5, stdin=secret) == {
        n: ["ok"] for n in NODES
    }
    assert all(g["_stdin"] == secret and secret not in g["command"] for g in got.values())
    stage_runner.run_everywhere(state, commands, 5)  # the other stages send nothing
    assert all("_stdin" not in g for g in got.values())


# ---- the pairs' rendezvous ports are checked for a holder, like the master port --------------


def test_each_node_is_checked_for_the_pair_ports_it_would_host():
    assert hosted_ports(LAB) == {
        # the bandwidth ring's (node1, node2), (node1, node3); the isolation's first pass
        "node1": {
            29501: "the bandwidth pair node1-node2",
            29502: "the isolation's node1-node3",
            29503: "the bandwidth pair node1-node3",
        },
        # (node2, node3); a second pass may pair a suspect with node2 or node3 on 29501
        "node2": {29502: "the bandwidth pair node2-node3", 29501: "an isolation pair"},
        "node3": {29501: "an isolation pair"},
    }
    # the ports the stages use are the ones checked
    jobs = bandwidth_stage.bandwidth_jobs(LAB, bandwidth_stage.bandwidth_plan(LAB)[0], 25, 30)
    for node, node_jobs in jobs.items():
        for _, first, _, address, port, _ in node_jobs:
            if address == LAB.node(node).address:  # this node hosts the pair
                assert first == 0 and port in hosted_ports(LAB)[node]


def test_a_held_pair_port_is_named_on_the_node_that_would_host_it_from_what_ss_printed(
    tmp_path,
):
    """The real hygiene script and the real ss, a real socket listening on a pair's port."""
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))  # every address: it meets the pair store's bind
        held.listen()
        port = held.getsockname()[1]
        command = shell_stage(
            stage_script("hygiene.sh"),
            port - 1,
            1,
            "node1",
            "/nonexistent",
            "x",
            f"1 {port}",
            "127.0.0.2",
            "",  # no environment variable printed
        )
        out = subprocess.run(
            ["sh", "-c", command.get_raw_value()], capture_output=True, text=True, timeout=30
        ).stdout.splitlines()
    seen = parse_hygiene(out)
    assert list(seen["pair_port_holders"]) == [port]
    assert seen["pair_port_holders"][port].startswith('users:(("python')
    hosted = {"node1": {port: "the bandwidth pair node1-node2"}}
    ((node, cause),) = [(p.node, p.cause) for p in pair_port_problems({"node1": seen}, hosted)]
    assert node == "node1" and cause.startswith(
        f"port {port}, the bandwidth pair node1-node2's rendezvous, is already in use (users:(("
    )
    # a port the node would host no pair on is not its problem
    assert pair_port_problems({"node2": seen}, {"node2": {port + 1: "x"}}) == []


def test_a_held_pair_port_runs_no_pair_and_no_isolation(monkeypatch):
    from checks import preflight_check

    sent: list[str] = []

    def run_everywhere(state, commands, seconds, stdin=None):
        sent.extend(c.get_raw_value() for c in commands.values())
        return {}  # every rank silent: the collective fails

    monkeypatch.setattr(collective_stage, "run_everywhere", run_everywhere)
    monkeypatch.setattr(preflight_check, "run_isolation", lambda *a: pytest.fail("isolation ran"))
    report = PreflightReport(cluster="lab", nodes=NODES)
    holder = 'users:(("nc",pid=77,fd=3))'
    report.details["hygiene"] = {"node2": {"pair_port_holders": {29502: holder}}}
    preflight_check._collective_stages(None, LAB, report, {}, set(NODES))
    assert len(sent) == 3 and not any(",29502," in raw or ",29501," in raw for raw in sent)
    assert report.stages["bandwidth"] == "skipped"


# ---- the ranks' own store as it ran on a real H200 (fixtures/hardware/h200_rendezvous)

H200_RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "hardware" / "h200_rendezvous"


def _h200_run(name: str, jobs: int) -> list[list[dict]]:
    """One rank's steps per job, from collective.sh's real output on the H200."""
    lines = (H200_RUNS / f"{name}.out").read_text().splitlines()
    (rank,) = [rank_output.job_steps(r, jobs) for r in rank_output.node_steps(lines, 1)]
    return rank


def test_nccl_meets_in_the_ranks_own_store_on_a_real_gpu_collective_then_a_timed_pair():
    collective, pair = _h200_run("nccl-collective-then-bandwidth", 2)
    for job in (collective, pair):
        assert collective_verdicts.rank_failure(job) is None
        steps = [s["step"] for s in job if s["step"] != "nccl"]
        assert steps[:4] == ["start", "reached", "joined", "initialised"], steps
    assert next(s for s in collective if s["step"] == "initialised")["backend"] == "nccl"
    (timed,) = [s for s in pair if s["step"] == "bandwidth"]
    assert timed["bytes"] == 256 << 20 and timed["iters"] >= 3
    assert any("NCCL INFO NCCL version 2.28.9" in s.get("text", "") for s in pair)
    # rank 0 said, for each job, how many connections its store refused: none
    assert [collective_verdicts.store_refused(job) for job in (collective, pair)] == [0, 0]


def test_nccl_failed_on_the_real_gpu_while_the_store_was_not_kept_alive():
    """Before ``kept``: NCCL called the store's Python ``clone`` after init_process_group, the
    Python half already collected ("Not implemented"); gloo, the lab's backend, never does. The
    rank names its failure as the collective's, never a pass."""
    lines = (H200_RUNS / "nccl-store-not-kept_before-fix.out").read_text().splitlines()
    ((job, *_),) = [rank_output.job_steps(r, 2) for r in rank_output.node_steps(lines, 1)]
    failure = collective_verdicts.rank_failure(job)
    assert failure is not None and "Not implemented" in failure
    assert not collective_verdicts.rendezvous_failed([job])  # it met: not the store's verdict


def test_torchs_store_client_could_not_even_complete_its_handshake_with_the_ranks_store():
    """On the H200, ``nobody`` ran torch's own store client against the port while rank 0
    waited 6 s for rank 1. All the recording shows: each try ended in torch's client's own
    connect timeout (the ranks' store speaks a protocol torch's client does not), so it forged
    nothing; the store counted what it refused, and both ranks passed with the right sum (a
    job that met is not failed by intruders). What a client of our own protocol without the
    secret gets is tested below, over loopback."""
    said = (H200_RUNS / "attack.txt").read_text()
    tries, forged = re.match(r"tries (\d+) forged (\d+) ", said).groups()
    assert int(tries) > 0 and int(forged) == 0
    assert "DistNetworkError: The client socket has timed out" in said
    assert "while trying to connect to (192.0.2.2, 29721)" in said  # the ranks' store's port
    for name in ("gloo-late-rank0", "gloo-late-rank1"):
        (job,) = _h200_run(name, 1)
        assert collective_verdicts.rank_failure(job) is None
        (summed,) = [s for s in job if s["step"] == "all_reduce"]
        assert summed["ok"] and summed["got"] == summed["expected"] == 3.0
    (host,), (joiner,) = _h200_run("gloo-late-rank0", 1), _h200_run("gloo-late-rank1", 1)
    assert collective_verdicts.store_refused(host) >= int(tries)  # each try, counted
    assert collective_verdicts.store_refused(joiner) is None  # only rank 0 serves the store
    assert not collective_verdicts.rendezvous_tampered([host, joiner])


def test_without_a_secret_on_stdin_no_rank_starts_on_the_real_machine():
    assert (H200_RUNS / "no-secret.out").read_text().split() == ["nosecret"]
    assert "rc 2" in (H200_RUNS / "no-secret.err").read_text()


# ---- the store's protocol, over real loopback sockets (collective.py imports without torch) ---


def _protocol():
    """collective.py as a module: its store and client; its ranks' code needs torch only when
    run as the script (``python -I -c``)."""
    path = Path(stage_runner.STAGES) / "collective.py"
    spec = importlib.util.spec_from_file_location("collective_protocol", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.torch is None  # torch was not imported
    return module


P = _protocol()
KEY = secrets.token_bytes(32)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def store():
    """A job's store (job 0 of world 2) on loopback, the pending limit and handshake bound made
    small so a flood and a silent peer take a moment, not 5 s."""
    port = _free_port()
    job = P.job_context("127.0.0.1", port, 2, 25, 0)
    server = P.StoreServer("127.0.0.1", port, KEY, job, pending=2, handshake=0.5)
    yield server
    server.close()


def _port(server) -> int:
    return server.sock.getsockname()[1]


def _client(server, secret=KEY, seconds=3.0):
    return P.Client(
        "127.0.0.1", _port(server), secret, time.monotonic() + seconds, server.context, 0.5
    )


def _refused(server, expected: int) -> int:
    """The store's count once it settled at ``expected`` (its threads count as they finish)."""
    until = time.monotonic() + 3
    while server.refused != expected and time.monotonic() < until:
        time.sleep(0.02)
    return server.refused


def _handshake(server, context: bytes, nonce: bytes | None = None, shown: bytes | None = None):
    """One raw handshake: (the store's nonce, what we sent, the store's answer or None where it
    closed the connection)."""
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=3) as conn:
        (theirs,) = P.receive(conn, 1, 32)
        mine = nonce or secrets.token_bytes(32)
        shown = shown or P.proof(KEY, b"rank", context, theirs + mine)
        P.send(conn, mine, context, shown)
        try:
            answer = P.receive(conn, 1, 32)
        except ConnectionError:
            answer = None
        return theirs, (mine, shown), answer


def test_ranks_holding_the_secret_meet_in_the_store_both_ends_proved_and_nothing_refused(store):
    ranks = [_client(store), _client(store)]
    deadline = time.monotonic() + 3
    done = []
    threads = [
        threading.Thread(target=lambda r=r: done.append(P.meet(ranks[r], r, 2, deadline)))
        for r in (0, 1)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert done == [None, None]
    one = ranks[0]
    assert one.add(b"joined", 0) == 2 and one.check([b"joined/0", b"joined/1", b"joined/all"])
    one.set(b"k", b"v")
    assert ranks[1].get(b"k", 1000) == b"v"
    assert one.compare_set(b"k", b"v", b"w") == b"w" and one.delete_key(b"k")
    twin = one.clone()  # torch's threads get connections of their own, proved the same way
    assert twin.num_keys() == 4
    for client in (*ranks, twin):
        client.close()  # a rank closing its end is no intruder
    assert _refused(store, 0) == 0
    assert store.close() == 0


def test_a_rendezvous_a_rank_misses_says_who_joined_and_who_did_not(store):
    with pytest.raises(P.Failed) as late:
        P.meet(_client(store), 0, 2, time.monotonic() + 0.3)
    assert (late.value.stage, late.value.data) == (
        "rendezvous",
        {"joined": [0], "missing": [1], "count": 1},
    )


def test_a_wrong_secret_is_refused_and_counted_and_a_rank_never_trusts_a_store_without_it(store):
    with pytest.raises(P.Failed) as refused:
        _client(store, secret=secrets.token_bytes(32), seconds=0.5)
    assert refused.value.data == {"reached": False}  # each try closed by the store
    assert store.refused >= 1  # counted before it closed
    # the other way: a process holding the port that answers without the secret is never used
    with socket.socket() as impostor:
        impostor.bind(("127.0.0.1", 0))
        impostor.listen()

        def answer_anything():
            conn, _ = impostor.accept()
            with conn:
                P.send(conn, secrets.token_bytes(32))
                P.receive(conn, 3, 256)
                P.send(conn, secrets.token_bytes(32))

        threading.Thread(target=answer_anything, daemon=True).start()
        port = impostor.getsockname()[1]
        with pytest.raises(P.Failed) as failed:
            P.Client("127.0.0.1", port, KEY, time.monotonic() + 0.5, b"job", 0.5)
    assert failed.value.data == {"reached": False, "impostor": True}


def test_a_proof_replayed_from_another_connection_or_made_for_another_job_is_refused(store):
    own, port = store.context, _port(store)
    theirs, (nonce, shown), answer = _handshake(store, own)
    assert answer == [P.proof(KEY, b"store", own, theirs + nonce)]  # a genuine rank's
    # the same message on a connection of its own: the store's nonce is fresh, the proof stale
    *_, answer = _handshake(store, own, nonce, shown)
    assert answer is None and _refused(store, 1) == 1
    # a proof made with the secret for another job, or another port, passed off as this one's
    for other in (
        P.job_context("127.0.0.1", port + 1, 2, 25, 0),  # another port
        P.job_context("127.0.0.2", port, 2, 25, 0),  # another address
        P.job_context("127.0.0.1", port, 3, 25, 0),  # another world
        P.job_context("127.0.0.1", port, 2, 55, 268435456),  # another round's pair
    ):
        with socket.create_connection(("127.0.0.1", _port(store)), timeout=3) as conn:
            (nonce,) = P.receive(conn, 1, 32)
            mine = secrets.token_bytes(32)
            P.send(conn, mine, own, P.proof(KEY, b"rank", other, nonce + mine))
            with pytest.raises(ConnectionError):
                P.receive(conn, 1, 32)
    assert _refused(store, 5) == 5
    # a rank of the run honestly at another job's store (a relay, or a port reused by a later
    # round) is refused too, uncounted: it proved the secret, for a job of its own
    *_, answer = _handshake(store, P.job_context("127.0.0.1", port + 1, 2, 25, 0))
    assert answer is None and _refused(store, 5) == 5


def test_connections_past_the_pending_limit_are_closed_at_once_and_counted(store):
    held = [socket.create_connection(("127.0.0.1", _port(store)), timeout=3) for _ in range(2)]
    try:
        for conn in held:
            assert len(P.receive(conn, 1, 32)[0]) == 32  # both are proving themselves
        assert store.refused == 2  # still proving: not a rank's yet
        with socket.create_connection(("127.0.0.1", _port(store)), timeout=3) as third:
            assert third.recv(4) == b""  # closed without a word
        assert _refused(store, 3) == 3
    finally:
        for conn in held:
            conn.close()
    assert _refused(store, 3) == 3  # each counted once
    client = _client(store)  # a rank gets in once the slots are free
    client.close()


def test_a_silent_peer_is_dropped_after_the_handshake_bound_and_counted(store):
    with socket.create_connection(("127.0.0.1", _port(store)), timeout=3) as silent:
        began = time.monotonic()
        P.receive(silent, 1, 32)
        assert silent.recv(4) == b""  # the store hung up on it
        assert 0.4 < time.monotonic() - began < 2.0
    assert _refused(store, 1) == 1


def test_a_proved_peer_that_sends_what_no_rank_sends_is_cut_off_and_counted(store):
    client = _client(store)
    with pytest.raises(ConnectionError):
        client.call(b"list_keys")  # no rank asks this (torch's list_keys would read every key)
    assert _refused(store, 1) == 1
    client.close()


def test_a_peer_still_proving_itself_when_the_store_closes_is_counted(store):
    with socket.create_connection(("127.0.0.1", _port(store)), timeout=3) as silent:
        P.receive(silent, 1, 32)
        assert store.close() == 1
