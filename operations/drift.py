"""Drift detection: one fingerprint per node, what the spec expects of it, and the verdict.

``observe`` turns a node's fingerprint into normalised property values; ``expect`` derives
the same properties from the spec with the very functions the deploy writes with; the
comparison itself is ``trainfleet.drift.compare``. Nothing here changes a node.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from facts.fingerprint import NodeFingerprint
from operations.gather import gather_fact, once_per_run
from trainfleet.launchers import LAUNCHER_FILES, render_launchers
from trainfleet.render import render, render_lines
from operations.report import publish
from operations.report import report_path as report_file
from trainfleet.pins import package_pins, torch_requirement
from trainfleet import mesh
from trainfleet.defaults import MESH_KEY_NAME
from trainfleet.drift import ABSENT, Report, compare, digest
from trainfleet.etc_hosts import stale_lines
from trainfleet.keystore import KeyStore
from trainfleet.model import Cluster, Node
from trainfleet.nccl import Derived, derive_cluster, uniform_variables
from trainfleet.openmpi import cluster_params

NCCL_PREFIXES = ("NCCL_", "GLOO_", "UCX_")


def _env_string(env: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(env.items()) if k.startswith(NCCL_PREFIXES)) or "none"


def _launchers_digest(files: dict[str, Any], sha_of: Any) -> str:
    return digest([f"{name} {sha_of(files[name])}" for name in sorted(LAUNCHER_FILES) if name in files]
                  if any(name in files for name in LAUNCHER_FILES) else None)


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
        "pdsh": ("installed" if fp["pdsh"]["installed"] else "missing") + f", rcmd {fp['pdsh']['rcmd_default'] or 'default'}",
        "pdsh nodes": digest(fp["pdsh"]["genders"]["block"]),
        "NCCL env (non-login ssh)": _env_string(fp["nccl_seen"]["non_login"]),
        "NCCL env (login shell)": _env_string(fp["nccl_seen"]["login"]),
        "NCCL env files": digest([fp["nccl_files"]["profile"] or ABSENT, *(fp["nccl_files"]["environment"]["block"] or []),
                                  "--", *(fp["nccl_files"]["nccl_conf"]["block"] or [])]),
        "launcher files": _launchers_digest(fp["launchers"], lambda f: f["sha256"]),
        "cuda": (stack.get("nvcc") or {}).get("release") or ABSENT,
        "torch": (stack.get("torch") or {}).get("version") or ABSENT,
        "gcc": (stack.get("gcc") or {}).get("version") or ABSENT,
        "openmpi": fp["openmpi"]["version"] or ABSENT,
    }
    for name, version in sorted(stack.get("packages", {}).items()):
        if name.startswith(("libnccl", "libcudnn", "cuda-toolkit")):
            props[f"package {name}"] = version
    for user in users:
        state = fp[f"mesh_user:{user}"]
        props[f"authorized_keys ({user})"] = digest(state["authorized"]["block"])
        props[f"ssh config ({user})"] = digest(state["config"]["block"])
        mpi_user = fp["openmpi"]["users"].get(user)
        props[f"openmpi params ({user})"] = digest(mpi_user["params"]["block"] if mpi_user else None)
        key = state["identity"]
        props[f"cluster key ({user})"] = f"{key['sha256'][:12]} {key['mode']}" if key else ABSENT
        proof = fp[f"mesh_proof:{user}"]
        failures = {peer: why for peer, why in proof.items() if why != "ok"}
        if not proof:  # the probe printed nothing: a check that saw nothing is no pass
            props[f"ssh mesh ({user})"] = "not probed"
        else:
            props[f"ssh mesh ({user})"] = "ok" if not failures else "fails: " + "; ".join(
                f"{peer} ({why})" for peer, why in sorted(failures.items()))
    return props


def expect(cluster: Cluster, node: Node, keys: KeyStore, host_keys: dict[str, list[str]],
           derived: dict[str, Derived]) -> dict[str, str]:
    """What the spec says the node's properties must be: rendered exactly as the deploy renders."""
    mine = derived.get(node.name)
    uniform = uniform_variables({n: d.env for n, d in derived.items() if not d.problems})
    mca, mca_problems = cluster_params(derived, cluster.openmpi)
    props = {
        "hostname": node.name,
        "hostname (persistent)": node.name,
        "hosts block": digest(render_lines("hosts/hosts_block.j2", entries=cluster.hosts_entries())),
        "known_hosts block": digest(mesh.known_hosts_lines(cluster, host_keys)),
        "pdsh nodes": digest([f"{n.name} trainfleet" for n in cluster.nodes]),
    }
    if node.gpus == 0:  # a GPU node's count and model are the preflight's to check
        props["gpus"] = "none"
    if mine is not None and not mine.problems:
        env = _env_string(mine.env)
        props["NCCL env (non-login ssh)"] = env
        props["NCCL env (login shell)"] = env
        props["NCCL env files"] = digest([render("nccl_env/profile.sh.j2", env=mine.env),
                                          *render_lines("nccl_env/environment.j2", env=mine.env), "--",
                                          *render_lines("nccl_env/nccl.conf.j2", env=mine.env)])
        forward = {k: v for k, v in mine.env.items() if k in uniform}
        files = render_launchers(cluster, node, forward=forward, mca=mca)
        props["launcher files"] = _launchers_digest(
            files, lambda f: hashlib.sha256(f[0].encode()).hexdigest())
    for user in cluster.mesh_users:
        props[f"authorized_keys ({user})"] = digest(mesh.authorized_lines(cluster, user, keys))
        props[f"ssh config ({user})"] = digest(render_lines("ssh_mesh/ssh_config.j2", nodes=cluster.nodes,
                                                            user=user, key_name=MESH_KEY_NAME))
        props[f"ssh mesh ({user})"] = "ok"
        if not mca_problems:
            props[f"openmpi params ({user})"] = digest(render_lines("openmpi/mca_params.j2", params=mca))
        identity = mesh.identity(user, node, keys)
        props[f"cluster key ({user})"] = (f"{hashlib.sha256(identity.private.encode()).hexdigest()[:12]} 600"
                                          if identity else ABSENT)
    stack = cluster.stack
    if stack.get("torch"):
        props["torch"] = torch_requirement(stack["torch"], stack.get("torch_cuda") or "cpu").split("==", 1)[1]
    if stack.get("cuda"):
        props["cuda"] = ".".join(stack["cuda"].split(".")[:2])
    return props


def _stack_package_expectations(cluster: Cluster, family: str) -> dict[str, str]:
    try:
        pins = package_pins(cluster.stack, family)
    except ValueError:
        return {}
    return {f"package {name}": version for name, version in pins.items() if version}


def cluster_report(cluster: Cluster) -> Report:
    """Gather every node's fingerprint (one command each, in parallel), compare, print the
    table and write the JSON report, once per run."""
    return once_per_run("drift report", lambda state: _report(state, cluster))


def _report(state, cluster: Cluster) -> Report:
    keys = KeyStore(cluster.name)
    fingerprints = gather_fact(state, NodeFingerprint, users=cluster.mesh_users, peers=[n.name for n in cluster.nodes])
    reachable = {name: fp for name, fp in fingerprints.items() if fp}
    unreachable = {n.name: "could not connect or read its facts" for n in cluster.nodes if n.name not in reachable}
    host_keys, _ = mesh.cluster_host_keys(cluster, {name: fp["host_keys"] for name, fp in reachable.items()})
    derived = derive_cluster(cluster, {name: fp["network"] for name, fp in reachable.items()})
    observed = {name: observe(fp, cluster.mesh_users) for name, fp in reachable.items()}
    for name, fp in reachable.items():
        stale = stale_lines(fp["hosts"]["outside"], {k.lower(): v for k, v in cluster.address_of_name().items()})
        observed[name]["stale /etc/hosts lines"] = "; ".join(map(str, stale)) or "none"
    expected = {}
    for node in cluster.nodes:
        if node.name not in reachable:
            continue
        expected[node.name] = expect(cluster, node, keys, host_keys, derived)
        expected[node.name]["stale /etc/hosts lines"] = "none"
        expected[node.name].update(_stack_package_expectations(cluster, reachable[node.name]["stack"]["os"]["family"]))
    report = compare(cluster.name, [n.name for n in cluster.nodes], observed, expected, unreachable)
    _publish(report)
    return report


def report_path(cluster: str) -> Path:
    return report_file("drift", cluster)


def _publish(result: Report) -> None:
    publish(f"Drift report for {result.cluster}", result.table(all_rows=os.environ.get("TRAINFLEET_DRIFT_ALL") == "1"),
            [f"[{f.node}] {f}" for f in result.findings], result.dumps(), report_path(result.cluster),
            "TRAINFLEET_DRIFT_JSON")
