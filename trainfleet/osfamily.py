"""An OS's family and package manager, from /etc/os-release's ID, ID_LIKE and VERSION_ID."""

from __future__ import annotations

from typing import TypedDict


class OsFamilyT(TypedDict):
    id: str
    family: str  # debian | rhel | unknown
    version: str
    package_manager: str | None  # apt | dnf | yum


def os_family(os_id: str, like: str, version: str) -> OsFamilyT:
    """Map /etc/os-release's ID, ID_LIKE and VERSION_ID to a family and its package manager."""
    ids = {os_id, *like.split()}
    if ids & {"debian", "ubuntu"}:
        return {"id": os_id, "family": "debian", "version": version, "package_manager": "apt"}
    if ids & {"rhel", "centos", "fedora", "rocky", "almalinux"}:
        manager = "yum" if version.split(".")[0] == "7" else "dnf"
        return {"id": os_id, "family": "rhel", "version": version, "package_manager": manager}
    return {"id": os_id, "family": "unknown", "version": version, "package_manager": None}
