"""Drift detection: one fingerprint per node, what its plan says, and the verdict.

``observe`` turns a node's fingerprint into normalised property values; ``expect`` digests
the same properties from the node's plan, the very values the deploy gives its operations
(trainfleet/plan.py); the comparison itself is ``trainfleet.compare.compare``. Nothing here
changes a node.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pyinfra import logger

from checks.publish import publish
from checks.publish import report_path as report_file
from checks.unmanaged import fold_unmanaged
from facts.launchers_facts import LauncherContents
from runtime.bundle import NodeFingerprint, plan_inputs
from runtime.gather import gather_fact, once_per_run, preflight_exclusions, refused_sudo
from trainfleet import html_report
from trainfleet import metrics as prometheus
from trainfleet.capabilities import (
    CAPABILITIES,
    RULES,
    expected_steps,
    managed_expectations,
    pins_met,
)
from trainfleet.compare import (
    ABSENT,
    Content,
    Finding,
    Report,
    absent_everywhere_else,
    compare,
    deploy_changes,
    explain,
)
from trainfleet.controller_files import write_atomic
from trainfleet.defaults import LAUNCH_DIR
from trainfleet.hw import ledger
from trainfleet.key_material import KeyMaterial
from trainfleet.keystore import KeyStore
from trainfleet.mesh import (
    FULL_PROBE_ENV,
    STRIDE_ENV,
    probe_env_problems,
    probe_stride,
    probe_targets,
)
from trainfleet.model import Cluster
from trainfleet.plan import cluster_blocks, plan_cluster
from trainfleet.plan_types import ClusterPlan, NodePlan

LEDGER = "hardware ledger"  # drift's property for a node whose parts changed since the last run
MAX_ROTATION = 10**9  # drift runs: far past any cycle of strides (N-2 runs), yet a short number
REPORT_BYTES = 256 * 2**20  # the most of the last report read back (1024 nodes: a few MB)
Contents = dict[str, dict[str, Content]]  # property -> managed file -> its content
# {node: launcher file names} -> {node: {name: text}}: the changed files' text, read from the nodes
LauncherReader = Callable[[dict[str, list[str]]], dict[str, dict[str, str | None]]]


def observe(fp: dict[str, Any], plan: NodePlan, cluster: Cluster) -> dict[str, str]:
    """A node's fingerprint as normalised property values, every capability's."""
    props: dict[str, str] = {}
    for capability in CAPABILITIES:
        props.update(capability.observe(fp, plan, cluster))
    return props


def expect(plan: NodePlan) -> dict[str, str]:
    """What the node's properties must be: the plan's values, digested as ``observe`` digests
    what the node holds. A part the plan could not make (it has problems, so the deploy fails
    that step and writes nothing) is expected nothing of."""
    return {prop: value for prop, (value, _) in expected_steps(plan).items()}


def found_contents(fp: dict[str, Any], users: list[str]) -> Contents:
    """The managed files behind ``observe``'s digests, as the node holds them: key material
    by digest only, launcher files by digest until ``LauncherContents`` reads those that differ."""
    found: Contents = {}
    for capability in CAPABILITIES:
        found |= capability.found_contents(fp, users)
    return found


def wanted_contents(plan: NodePlan) -> Contents:
    """The managed files behind ``expect``'s digests, as the plan renders them."""
    wanted: Contents = {}
    for capability in CAPABILITIES:
        wanted |= capability.wanted_contents(plan)
    return wanted


def _changed_launchers(
    report: Report, wanted: dict[str, Contents], found: dict[str, Contents]
) -> dict[str, list[str]]:
    """{node: names of its launcher files whose digest is not the plan's}, for the nodes
    where drift found them changed."""
    changed = {}
    nodes = {f.node for f in report.findings if (f.kind, f.property) == ("spec", "launcher files")}
    for node in nodes:
        want, have = wanted[node]["launcher files"], found[node]["launcher files"]
        changed[node] = [
            path[len(LAUNCH_DIR) + 1 :]
            for path, seen in have.items()
            if seen.sha != want.get(path, Content(ABSENT, None)).sha
        ]
    return {node: names for node, names in changed.items() if names}


def _explain(
    report: Report,
    plan: ClusterPlan,
    fingerprints: dict[str, Any],
    users: list[str],
    read_launchers: LauncherReader | None,
) -> None:
    """Name the files behind each spec finding on a digest and show their diff; the launcher
    files that differ are read from their nodes (``read_launchers``) first, those alone."""
    nodes = {f.node for f in report.findings if f.kind == "spec"}
    wanted = {node: wanted_contents(plan.nodes[node]) for node in nodes}
    found = {node: found_contents(fingerprints[node], users) for node in nodes}
    changed = _changed_launchers(report, wanted, found)
    for node, texts in (read_launchers(changed) if read_launchers and changed else {}).items():
        files = found[node]["launcher files"]
        for name, text in (texts or {}).items():
            path = f"{LAUNCH_DIR}/{name}"
            if path in files:  # its digest stays what the fingerprint read
                files[path] = Content(files[path].sha, text)
    explain(report, wanted, found)


def compare_fingerprints(
    cluster: Cluster,
    fingerprints: dict[str, Any],
    keys: KeyMaterial,
    unreachable: dict[str, str] | None = None,
    read_launchers: LauncherReader | None = None,
    excluded: Mapping[str, list[str]] | None = None,
) -> Report:
    """The drift report of the nodes whose fingerprints were read: each observed, its plan
    (from those same fingerprints and the key store's snapshot, ``keys``) expected, then
    compared; a finding on a managed file names it and shows its diff (a launcher file's only
    if ``read_launchers``). Key material the snapshot lacks is a finding; nothing is written."""
    plan = plan_cluster(cluster, plan_inputs(fingerprints), keys, excluded)
    observed = {name: observe(fp, plan.nodes[name], cluster) for name, fp in fingerprints.items()}
    for prefix in RULES.absent_elsewhere:
        absent_everywhere_else(observed, prefix)
    node_steps = {name: expected_steps(plan.nodes[name]) for name in fingerprints}
    expected = {
        name: pins_met(observed[name], managed_expectations(node_steps[name], cluster.manage))
        for name in fingerprints
    }
    report = compare(
        cluster.name, [n.name for n in cluster.nodes], observed, expected, unreachable, rules=RULES
    )
    _explain(report, plan, fingerprints, cluster.mesh_users, read_launchers)
    # Before a first deploy (adopting a running cluster) this is what the deploy would do.
    steps = {
        name: {prop: step for prop, (_, step) in node_steps[name].items()} for name in fingerprints
    }
    report.not_managed = cluster.unmanaged
    report.would_change = deploy_changes(report.findings, steps)
    # A node trainfleet is not on (never deployed, or after trainfleet remove): its spec
    # findings fold into one "not managed", once what a deploy would change is taken from them.
    fold_unmanaged(report, fingerprints, cluster.mesh_users)
    return report


def cluster_report(cluster: Cluster, metrics: Path | None = None) -> Report:
    """Gather every node's fingerprint (one command each, in parallel), compare, print the
    table and write the JSON report (and, given ``metrics``, the Prometheus textfile), once per
    run."""
    return once_per_run("drift report", lambda state: _report(state, cluster, metrics))


def mesh_probe(
    names: list[str],
    previous: Any,
    env: dict[str, str],
    warn: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Which peers each node's live SSH probe logs in to this run: ``{"mode", "stride",
    "rotation", "logins_per_node"}``. By default a ring and a stride (``probe_targets``), the
    stride one step further than the last run's (its JSON report, ``previous``), so a constant
    number of logins per node covers every pair over the runs; ``full`` on request. The static
    half (every node holds exactly the planned keys, known hosts and config) is checked every
    run. A last report that is not one restarts the rotation, with a warning (``warn``)."""
    nodes = len(names)
    problems = probe_env_problems(nodes, env)
    if problems:  # the inventory refused these before any host was contacted
        raise ValueError("; ".join(problems))
    if env.get(FULL_PROBE_ENV) == "full":
        return {"mode": "full", "stride": 0, "rotation": None, "logins_per_node": nodes}
    done, why = last_rotation(previous)
    if why:
        warn(
            f"drift: the last report's mesh probe is ignored ({why}); the stride rotation restarts"
        )
    if env.get(STRIDE_ENV) and nodes >= 4:  # pinned: the rotation waits where it was
        return {
            "mode": "sampled",
            "stride": int(env[STRIDE_ENV]),
            "rotation": done,
            "logins_per_node": 2,
        }
    rotation = 0 if done is None else done + 1
    stride = probe_stride(nodes, rotation)
    logins = len(probe_targets(names, names[0], stride)) if names else 0
    return {"mode": "sampled", "stride": stride, "rotation": rotation, "logins_per_node": logins}


def last_rotation(previous: Any) -> tuple[int | None, str | None]:
    """The last run's stride rotation from its report (None: none yet, or a full probe), and
    why a report's was not taken (None: it was). A count of runs is 0..MAX_ROTATION: a larger
    one cannot come from runs, and would soon be too long a number to write back."""
    if previous is None:
        return None, None
    last = previous.get("mesh_probe", {}) if isinstance(previous, dict) else None
    if not isinstance(last, dict):
        return None, "not a drift report"
    done = last.get("rotation")
    if done is None:
        return None, None
    if isinstance(done, bool) or not isinstance(done, int):
        return None, f"its rotation is {type(done).__name__}, not a count of runs"
    if not 0 <= done <= MAX_ROTATION:  # never str(done): a huge int is an error of its own
        return None, f"its rotation is {'below 0' if done < 0 else f'above {MAX_ROTATION}'}"
    return done, None


def _previous(path: Path, warn: Callable[[str], None]) -> Any:
    """The last drift report as JSON (it is the controller's own file), None if there is none;
    one too large or that is not JSON is ignored with a warning."""
    return _own_json(
        path, warn, "the last report", "a drift report", "the stride rotation restarts"
    )


def _own_json(path: Path, warn: Callable[[str], None], what: str, kind: str, then: str) -> Any:
    """One of the controller's own JSON files (at most REPORT_BYTES), None if there is none;
    one that cannot be read or is not JSON is ignored, with a warning saying ``then``."""
    try:
        with path.open("rb") as file:
            data = file.read(REPORT_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        warn(f"drift: {what} {path} cannot be read ({exc}); {then}")
        return None
    try:
        if len(data) > REPORT_BYTES:
            raise ValueError(f"larger than {REPORT_BYTES} bytes")
        return json.loads(data)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep to parse
        warn(f"drift: {what} {path} is not {kind} ({str(exc)[:80]}); {then}")
        return None


def _report(state, cluster: Cluster, metrics: Path | None = None) -> Report:
    names = [n.name for n in cluster.nodes]
    previous = _previous(report_path(cluster.name), logger.warning)
    probe = mesh_probe(names, previous, dict(os.environ), logger.warning)
    fingerprints = gather_fact(
        state,
        NodeFingerprint,
        users=cluster.mesh_users,
        peers=[],
        blocks=cluster_blocks(cluster),
        per_node=lambda name: {"peers": probe_targets(names, name, probe["stride"])},
    )
    reachable = {name: fp for name, fp in fingerprints.items() if fp}
    refused = refused_sudo(state)
    unreachable = {
        n.name: refused.get(n.name, "could not connect or read its facts")
        for n in cluster.nodes
        if n.name not in reachable
    }
    report = compare_fingerprints(
        cluster,
        reachable,
        KeyStore(cluster.name).snapshot(cluster.mesh_users, names),  # read only
        unreachable,
        lambda changed: _read_launchers(state, changed),
        preflight_exclusions(cluster),
    )
    report.mesh_probe = probe
    before = read_ledger(cluster.name, logger.warning)
    seen = {
        name: ledger.read_now(before.get(name, {}), fp.get("hardware"))
        for name, fp in reachable.items()
    }
    for name, now in seen.items():
        found = ledger.changes(before[name], now) if name in before else []
        report.observed[name][LEDGER] = (
            "; ".join(found) if found else "as recorded" if name in before else "first reading"
        )
    report.findings += ledger_findings(before, seen)
    _publish(report)
    if metrics is not None:
        prometheus.write(metrics, prometheus.report_registry(report, "drift", time.time()))
        print(f"    Prometheus metrics: {metrics}", file=sys.stderr)
    write_ledger(cluster.name, before, seen)
    return report


def ledger_findings(
    before: dict[str, dict[str, str]], seen: dict[str, dict[str, str]]
) -> list[Finding]:
    """A finding per node whose parts changed since the ledger's last reading of it (a node the
    ledger has not seen yet is recorded, not named)."""
    return [
        Finding(node, LEDGER, "changed", "; ".join(found), "as recorded")
        for node, now in seen.items()
        if node in before and (found := ledger.changes(before[node], now))
    ]


def ledger_path(cluster: str) -> Path:
    """``.trainfleet/reports/hardware-ledger-<cluster>.json``, beside the drift report."""
    return report_file("hardware-ledger", cluster)


def read_ledger(cluster: str, warn: Callable[[str], None]) -> dict[str, dict[str, str]]:
    """The ledger's last readings (none yet: empty); one that is not a ledger is set aside
    with a warning, and the run records anew."""
    path = ledger_path(cluster)
    anew = "it is recorded anew"
    data = _own_json(path, warn, "the hardware ledger", "a hardware ledger", anew)
    if data is None:
        return {}
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not (
        isinstance(nodes, dict)
        and all(
            isinstance(p, dict) and all(isinstance(v, str) for v in p.values())
            for p in nodes.values()
        )
    ):
        warn(f"drift: {path} is not a hardware ledger; it is recorded anew")
        return {}
    return nodes


def write_ledger(
    cluster: str, before: dict[str, dict[str, str]], seen: dict[str, dict[str, str]]
) -> None:
    """Record this run's parts (atomically; the controller's own file)."""
    text = json.dumps({"nodes": ledger.updated(before, seen)}, indent=1, sort_keys=True)
    # serial numbers: the controller user's alone, as the captures are
    write_atomic(ledger_path(cluster), text, mode=0o600)


def _read_launchers(state, changed: dict[str, list[str]]) -> dict[str, dict[str, str | None]]:
    """The named launcher files' text from their nodes: one command each, to those nodes only."""
    return gather_fact(
        state,
        LauncherContents,
        nodes=changed,
        directory=LAUNCH_DIR,
        per_node=lambda name: {"names": changed[name]},
    )


def report_path(cluster: str) -> Path:
    return report_file("drift", cluster)


def _publish(result: Report) -> None:
    # the node x property grid even where it does not fit 160 columns (else it folds)
    wide = os.environ.get("TRAINFLEET_WIDE") == "1"
    publish(
        f"Drift report for {result.cluster}",
        result.table(all_rows=os.environ.get("TRAINFLEET_DRIFT_ALL") == "1", wide=wide),
        [*result.finding_lines(wide=wide), *result.change_lines()],
        result.dumps(),
        report_path(result.cluster),
        "TRAINFLEET_DRIFT_JSON",
    )
    page = report_path(result.cluster).with_suffix(".html")  # one page beside the JSON
    write_atomic(page, html_report.page(result, f"Drift report for {result.cluster}"))
    print(f"    HTML report: {page}", file=sys.stderr)
