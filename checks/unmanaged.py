"""Drift's word on a node trainfleet is not on (never deployed, or ``trainfleet remove`` ran):
one finding, "not managed", instead of a finding per block and file that is missing."""

from __future__ import annotations

from typing import Any

from trainfleet.compare import Finding, Report

PROPERTY = "trainfleet"


def not_managed(fp: dict[str, Any], users: list[str]) -> bool:
    """No trace of trainfleet in the node's fingerprint: no block in /etc/hosts or the system
    known_hosts, none in any mesh user's authorized_keys or ~/.ssh/config, no launcher file.
    A section that was not read is no proof of absence, nor is a block the parser refuses (a
    lone marker: the file remove refuses to touch): the node counts as managed."""
    blocks = [fp.get("hosts"), fp.get("known_hosts")]
    for user in users:
        mesh = fp.get(f"mesh_user:{user}")
        blocks += [mesh and mesh["authorized"], mesh and mesh["config"]]
    if any(block is None or block["block"] is not None or block["broken"] for block in blocks):
        return False
    return fp.get("launchers") == {}


def fold_unmanaged(report: Report, fingerprints: dict[str, Any], users: list[str]) -> None:
    """Each node that is not managed: its spec findings folded into one "not managed"; what
    it is compared with its peers on (majority, uniqueness) stays."""
    nodes = {name for name, fp in fingerprints.items() if fp and not_managed(fp, users)}
    if not nodes:
        return
    kept = [f for f in report.findings if f.node not in nodes or f.kind != "spec"]
    report.findings = [
        *kept,
        *(Finding(node, PROPERTY, "spec", "not managed", "managed") for node in sorted(nodes)),
    ]
