"""An OS's family and package manager, from /etc/os-release's ID, ID_LIKE and VERSION_ID."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

OsField = tuple[str, str, str]  # (the key a fact prints, the os-release variable, its default)
# What facts/os_release_facts.py's fragment prints for ``os_release``.
OS_FIELDS: tuple[OsField, ...] = (
    ("id", "ID", "unknown"),
    ("like", "ID_LIKE", ""),
    ("version", "VERSION_ID", ""),
)


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


def os_release(head: Mapping[str, str]) -> OsFamilyT:
    """The OS family from the ``id``/``like``/``version`` lines the os-release fragment printed
    (``key -> value``; a missing key: its OS_FIELDS default)."""
    return os_family(*(head.get(key, default) for key, _, default in OS_FIELDS))
