"""Drift detection: one fingerprint per node, what its plan says, and the verdict.

``observe`` turns a node's fingerprint into normalised property values; ``expect`` digests
the same properties from the node's plan, the very values the deploy gives its operations
(trainfleet/plan.py); the comparison itself is ``trainfleet.compare.compare``. Nothing here
changes a node.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyinfra import logger

from checks.publish import publish
from checks.publish import report_path as report_file
from facts.fingerprint import NodeFingerprint, plan_inputs
from facts.launchers_facts import LauncherContents
from facts.managed_block_facts import decode
from facts.openmpi_facts import MCA_FILE
from runtime.gather import gather_fact, once_per_run, refused_sudo
from trainfleet.capabilities import gpu_node
from trainfleet.capabilities.launchers import LAUNCH_FILE_NAMES
from trainfleet.compare import (
    ABSENT,
    PYTHON_PREFIX,
    Content,
    Report,
    absent_everywhere_else,
    compare,
    content,
    digest,
    explain,
    printable,
)
from trainfleet.defaults import (
    LAUNCH_DIR,
    NCCL_CONF,
    NCCL_ENVIRONMENT,
    NCCL_PROFILE,
    PDSH_GENDERS,
    REVOKED_KEYS,
    SSHD_MESH_CONF,
    SYSTEM_KNOWN_HOSTS,
)
from trainfleet.driver_pins import satisfies_driver
from trainfleet.etc_hosts import stale_lines
from trainfleet.keystore import KeyStore
from trainfleet.mesh import (
    FULL_PROBE_ENV,
    STRIDE_ENV,
    certificate_summary,
    file_digest,
    host_certificates_summary,
    probe_env_problems,
    probe_stride,
    probe_targets,
    sshd_files_digest,
)
from trainfleet.model import Cluster
from trainfleet.pins import PINNED_PACKAGES, satisfies
from trainfleet.plan import ClusterPlan, NodePlan, cluster_blocks, genders_lines, plan_cluster

NCCL_PREFIXES = ("NCCL_", "GLOO_", "UCX_")
MAX_ROTATION = 10**9  # drift runs: far past any cycle of strides (N-2 runs), yet a short number
REPORT_BYTES = 256 * 2**20  # the most of the last report read back (1024 nodes: a few MB)
Contents = dict[str, dict[str, Content]]  # property -> managed file -> its content
# {node: launcher file names} -> {node: {name: text}}: the changed files' text, read from the nodes
LauncherReader = Callable[[dict[str, list[str]]], dict[str, dict[str, str | None]]]


def _env_string(env: dict[str, str]) -> str:
    return (
        " ".join(f"{k}={v}" for k, v in sorted(env.items()) if k.startswith(NCCL_PREFIXES))
        or "none"
    )


def _launchers_digest(files: dict[str, Any], sha_of: Any) -> str:
    return digest(
        [f"{name} {sha_of(files[name])}" for name in sorted(LAUNCH_FILE_NAMES) if name in files]
        if any(name in files for name in LAUNCH_FILE_NAMES)
        else None
    )


def package_props(stack: dict[str, Any]) -> dict[str, str]:
    """Each installed stack package's version, and whether it is held (``apt-mark hold``, dnf/yum
    versionlock): a released hold is drift before an upgrade moves the package."""
    props = {}
    for name, version in sorted(stack.get("packages", {}).items()):
        if re.match(PINNED_PACKAGES, name):
            props[f"package {name}"] = version
            props[f"package {name} hold"] = "held" if name in stack.get("held", []) else "not held"
    return props


def observe(fp: dict[str, Any], users: list[str]) -> dict[str, str]:
    """A node's fingerprint as normalised property values."""
    ident, stack = fp["identity"], fp["stack"]
    gpus = ident.get("gpus", [])
    props = {
        "hostname": fp["hostname"]["running"],
        "hostname (persistent)": fp["hostname"]["static"] or ABSENT,
        "boot_id": ident.get("boot_id") or ABSENT,
        "machine-id": ident.get("machine_id") or ABSENT,
        "os": ident.get("os", ABSENT),
        "kernel": ident.get("kernel", ABSENT),
        "gpus": f"{len(gpus)}x {gpus[0]['name']}" if gpus else "none",
        "gpu driver": gpus[0]["driver"] if gpus else "none",
        "hosts block": digest(fp["hosts"]["block"]),
        "known_hosts block": digest(fp["known_hosts"]["block"]),
        "pdsh": ("installed" if fp["pdsh"]["installed"] else "missing")
        + f", rcmd {fp['pdsh']['rcmd_default'] or 'default'}",
        "pdsh nodes": digest(fp["pdsh"]["genders"]["block"]),
        "NCCL env (non-login ssh)": _env_string(fp["nccl_seen"]["non_login"]),
        "NCCL env (login shell)": _env_string(fp["nccl_seen"]["login"]),
        "NCCL env files": digest(
            [
                fp["nccl_files"]["profile"] or ABSENT,
                *(fp["nccl_files"]["environment"]["block"] or []),
                "--",
                *(fp["nccl_files"]["nccl_conf"]["block"] or []),
            ]
        ),
        "launcher files": _launchers_digest(fp["launchers"], lambda f: f["sha256"]),
        "cuda": (stack.get("nvcc") or {}).get("release") or ABSENT,
        "torch": (stack.get("torch") or {}).get("version") or ABSENT,
        "gcc": (stack.get("gcc") or {}).get("version") or ABSENT,
        "openmpi": fp["openmpi"]["version"] or ABSENT,
    }
    for name, version in stack.get("venv_packages", {}).items():
        props[f"{PYTHON_PREFIX}{name}"] = version
    props.update(package_props(stack))
    sshd = fp["sshd_mesh"]
    props["host certificates"] = host_certificates_summary(sshd["certificates"])
    props["sshd mesh files"] = sshd_files_digest(sshd["drop_in"], sshd["revoked_keys"])
    props["ssh client drop-in"] = file_digest(sshd["client_drop_in"])
    for user in users:
        state = fp[f"mesh_user:{user}"]
        props[f"user certificate ({user})"] = certificate_summary(state["certificate"])
        props[f"authorized_keys ({user})"] = digest(state["authorized"]["block"])
        props[f"ssh config ({user})"] = digest(state["config"]["block"])
        mpi_user = fp["openmpi"]["users"].get(user)
        props[f"openmpi params ({user})"] = digest(
            mpi_user["params"]["block"] if mpi_user else None
        )
        key = state["identity"]
        props[f"cluster key ({user})"] = f"{key['sha256'][:12]} {key['mode']}" if key else ABSENT
        proof = fp[f"mesh_proof:{user}"]
        failures = {peer: why for peer, why in proof.items() if why != "ok"}
        if not proof:  # the probe printed nothing: a check that saw nothing is no pass
            props[f"ssh mesh ({user})"] = "not probed"
        else:
            props[f"ssh mesh ({user})"] = (
                "ok"
                if not failures
                else "fails: "
                + "; ".join(f"{peer} ({why})" for peer, why in sorted(failures.items()))
            )
    return props


def expect(plan: NodePlan) -> dict[str, str]:
    """What the node's properties must be: the plan's values, digested as ``observe`` digests
    what the node holds. A part the plan could not make (it has problems, so the deploy fails
    that step and writes nothing) is expected nothing of."""
    node = plan.node
    props = {
        "hostname": plan.hostname,
        "hostname (persistent)": plan.hostname,
        "hosts block": digest(plan.hosts.lines),
        "stale /etc/hosts lines": "none",
        "known_hosts block": digest(plan.known_hosts),
        "pdsh nodes": digest(genders_lines(plan.pdsh_nodes)),
    }
    if node.gpus == 0:  # a GPU node's count and model are the preflight's to check
        props["gpus"] = "none"
    if not plan.nccl.problems:
        env = _env_string(plan.nccl.env)
        props["NCCL env (non-login ssh)"] = env
        props["NCCL env (login shell)"] = env
        props["NCCL env files"] = digest(
            [plan.nccl.profile, *plan.nccl.environment, "--", *plan.nccl.nccl_conf]
        )
    if not plan.launchers.problems:
        props["launcher files"] = _launchers_digest(
            plan.launchers.files, lambda f: hashlib.sha256(f[0].encode()).hexdigest()
        )
    if plan.sshd is not None:
        props["sshd mesh plan"] = "ok"
    if plan.sshd and not plan.sshd.problems:
        props["host certificates"] = host_certificates_summary(plan.sshd.certificates)
        props["sshd mesh files"] = sshd_files_digest(plan.sshd.drop_in, plan.sshd.revoked_keys)
        props["ssh client drop-in"] = file_digest(plan.sshd.client_drop_in)
    for user in plan.mesh:
        props[f"user certificate ({user.user})"] = certificate_summary(user.certificate)
        props[f"authorized_keys ({user.user})"] = digest(user.authorized)
        props[f"ssh config ({user.user})"] = digest(user.config)
        props[f"ssh mesh ({user.user})"] = "ok"
        if not plan.mpi.problems:
            props[f"openmpi params ({user.user})"] = digest(plan.mpi.lines)
        props[f"cluster key ({user.user})"] = (
            f"{hashlib.sha256(user.identity.private.encode()).hexdigest()[:12]} 600"
            if user.identity
            else ABSENT
        )
    if plan.stack.torch:
        props["torch"] = plan.stack.torch
    if plan.stack.spec.get("cuda"):
        props["cuda"] = ".".join(plan.stack.spec["cuda"].split(".")[:2])
    props.update(
        {f"package {name}": version for name, version in plan.stack.packages.items() if version}
    )
    props.update({f"package {name} hold": "held" for name in plan.stack.packages})  # each pin held
    props.update({f"{PYTHON_PREFIX}{name}": version for name, version in plan.stack.python.items()})
    props.update(
        gpu_node.expected(plan.gpu)
    )  # a part that cannot be planned (fabric manager) is left out
    props["GPU settings plan"] = "ok"  # its problems show as this property's value
    if plan.gpu.driver:  # a branch pin is met by any release of it (pins_met)
        props["gpu driver"] = plan.gpu.driver
    return props


def found_contents(fp: dict[str, Any], users: list[str]) -> Contents:
    """The managed files behind ``observe``'s digests, as the node holds them: key material
    by digest only, launcher files by digest until ``LauncherContents`` reads those that differ."""
    nccl, sshd = fp["nccl_files"], fp["sshd_mesh"]
    drop_in = None if sshd["drop_in"] is None else decode(sshd["drop_in"])
    found = {
        "hosts block": {"/etc/hosts": content(fp["hosts"]["block"])},
        "known_hosts block": {SYSTEM_KNOWN_HOSTS: content(fp["known_hosts"]["block"], shown=False)},
        "pdsh nodes": {PDSH_GENDERS: content(fp["pdsh"]["genders"]["block"])},
        "NCCL env files": {
            NCCL_PROFILE: content(nccl["profile"]),
            NCCL_ENVIRONMENT: content(nccl["environment"]["block"]),
            NCCL_CONF: content(nccl["nccl_conf"]["block"]),
        },
        "launcher files": {
            f"{LAUNCH_DIR}/{name}": Content(f["sha256"], None)
            for name, f in fp["launchers"].items()
            if name in LAUNCH_FILE_NAMES
        },
        "sshd mesh files": {
            SSHD_MESH_CONF: content(drop_in),
            REVOKED_KEYS: content(sshd["revoked_keys"], shown=False),
        },
    }
    for user in users:
        state, mpi = fp[f"mesh_user:{user}"], fp["openmpi"]["users"].get(user)
        found |= _user_contents(
            user,
            state["authorized"]["block"],
            state["config"]["block"],
            mpi["params"]["block"] if mpi else None,
        )
    return found


def wanted_contents(plan: NodePlan) -> Contents:
    """The managed files behind ``expect``'s digests, as the plan renders them."""
    nccl, sshd = plan.nccl, plan.sshd
    wanted = {
        "hosts block": {"/etc/hosts": content(plan.hosts.lines)},
        "known_hosts block": {SYSTEM_KNOWN_HOSTS: content(plan.known_hosts, shown=False)},
        "pdsh nodes": {PDSH_GENDERS: content(genders_lines(plan.pdsh_nodes))},
        "NCCL env files": {
            NCCL_PROFILE: content(nccl.profile),
            NCCL_CONF: content(nccl.nccl_conf),
            NCCL_ENVIRONMENT: content(nccl.environment),
        },
        "launcher files": {
            f"{LAUNCH_DIR}/{name}": content(text)
            for name, (text, _) in plan.launchers.files.items()
        },
    }
    if sshd is not None:
        wanted["sshd mesh files"] = {
            SSHD_MESH_CONF: content(sshd.drop_in),
            REVOKED_KEYS: content(sshd.revoked_keys, shown=False),
        }
    for user in plan.mesh:
        wanted |= _user_contents(user.user, user.authorized, user.config, plan.mpi.lines)
    return wanted


def _user_contents(
    user: str, authorized: list[str] | None, config: list[str] | None, params: list[str] | None
) -> Contents:
    keys = content(authorized, shown=False)
    return {
        f"authorized_keys ({user})": {f"~{user}/.ssh/authorized_keys": keys},
        f"ssh config ({user})": {f"~{user}/.ssh/config": content(config)},
        f"openmpi params ({user})": {f"~{user}/{MCA_FILE}": content(params)},
    }


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
            path.rsplit("/", 1)[1]
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


def pins_met(seen: dict[str, str], want: dict[str, str]) -> dict[str, str]:
    """``want`` with each pin the node meets replaced by what it has: a venv pin means what pip's
    == means (1.0 is 1.0.0), a driver branch pin (550) any release of that branch."""
    met = dict(want)
    for prop, pin in want.items():
        have = seen.get(prop)
        if have in (None, ABSENT, "none"):
            continue
        if (prop.startswith(PYTHON_PREFIX) and satisfies(have, pin)) or (
            prop == "gpu driver" and satisfies_driver(have, pin)
        ):
            met[prop] = have
    return met


def compare_fingerprints(
    cluster: Cluster,
    fingerprints: dict[str, Any],
    keys: KeyStore,
    unreachable: dict[str, str] | None = None,
    read_launchers: LauncherReader | None = None,
) -> Report:
    """The drift report of the nodes whose fingerprints were read: each observed, its plan
    (from those same fingerprints and the key store) expected, then compared; a finding on a
    managed file names it and shows its diff (a launcher file's only if ``read_launchers``)."""
    plan = plan_cluster(cluster, plan_inputs(fingerprints), keys)
    observed = {}
    for name, fp in fingerprints.items():
        observed[name] = observe(fp, cluster.mesh_users)
        stale = stale_lines(fp["hosts"]["outside"], plan.nodes[name].hosts.names)
        observed[name]["stale /etc/hosts lines"] = "; ".join(map(str, stale)) or "none"
        observed[name].update(
            gpu_node.observed(
                fp.get("gpu_node"),
                fp.get("network"),
                cluster.node(name).address,
                cluster.gpu.get("max_clock_offset_ms", 100),
            )
        )
        observed[name]["GPU settings plan"] = "; ".join(plan.nodes[name].gpu.problems) or "ok"
        if (
            plan.nodes[name].sshd is not None
        ):  # a node whose sshd part cannot be planned is a finding, not a gap
            observed[name]["sshd mesh plan"] = "; ".join(plan.nodes[name].sshd.problems) or "ok"
    absent_everywhere_else(observed, PYTHON_PREFIX)
    expected = {name: pins_met(observed[name], expect(plan.nodes[name])) for name in fingerprints}
    report = compare(cluster.name, [n.name for n in cluster.nodes], observed, expected, unreachable)
    _explain(report, plan, fingerprints, cluster.mesh_users, read_launchers)
    return report


def cluster_report(cluster: Cluster) -> Report:
    """Gather every node's fingerprint (one command each, in parallel), compare, print the
    table and write the JSON report, once per run."""
    return once_per_run("drift report", lambda state: _report(state, cluster))


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
    try:
        with path.open("rb") as file:
            data = file.read(REPORT_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        warn(f"drift: the last report {path} cannot be read ({exc}); the stride rotation restarts")
        return None
    try:
        if len(data) > REPORT_BYTES:
            raise ValueError(f"larger than {REPORT_BYTES} bytes")
        return json.loads(data)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep to parse
        warn(
            f"drift: the last report {path} is not a drift report ({str(exc)[:80]}); "
            "the stride rotation restarts"
        )
        return None


def _report(state, cluster: Cluster) -> Report:
    names = [n.name for n in cluster.nodes]
    previous = _previous(report_path(cluster.name), logger.warning)
    probe = mesh_probe(names, previous, dict(os.environ), logger.warning)
    fingerprints = gather_fact(
        state,
        NodeFingerprint,
        users=cluster.mesh_users,
        peers=[],
        **cluster_blocks(cluster),
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
        KeyStore(cluster.name),
        unreachable,
        lambda changed: _read_launchers(state, changed),
    )
    report.mesh_probe = probe
    _publish(report)
    return report


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
    publish(
        f"Drift report for {result.cluster}",
        result.table(all_rows=os.environ.get("TRAINFLEET_DRIFT_ALL") == "1"),
        [printable(f"[{f.node}] {f}") for f in result.findings],
        result.dumps(),
        report_path(result.cluster),
        "TRAINFLEET_DRIFT_JSON",
    )
