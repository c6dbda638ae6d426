"""The lab's image: files every new node's disk starts with, beside the host's / below it.

apt's package caches, built once on the host and hard-linked into each node's disk (an
overlay cannot stack a second lower layer from inside the first). The host (a container image) turns
them off (``Dir::Cache::pkgcache ""``), so every apt call in a node would parse the package
lists again (~0.7 s of CPU each, on every node); a real server keeps them. apt checks a cache
against the lists and the dpkg status it was built from, and rebuilds its own copy in the
node's disk when they differ: a stale image costs time, never correctness.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

IMAGE_DIR = Path(os.environ.get("TRAINFLEET_LAB_IMAGE", "/var/cache/trainfleet/lab-image"))
APT_CONF = "etc/apt/apt.conf.d/zz-trainfleet-lab-apt-cache"
APT_CACHE = "var/cache/apt"
# What the caches are built from: a change to any of them rebuilds the image.
SOURCES = (Path("/var/lib/dpkg/status"), Path("/var/lib/apt/lists"), Path("/etc/apt"))


def mkdirs_like_host(top: Path, relative: str) -> Path:
    """Create TOP/relative with the host's modes and owners (a layer's directory hides the
    host's attributes in the node: /root stays 0700, /var/cache 0755)."""
    target, host = top, Path("/")
    for part in Path(relative).parts:
        target, host = target / part, host / part
        if not target.exists():
            target.mkdir()
            if host.is_dir():
                st = host.stat()
                os.chmod(target, stat.S_IMODE(st.st_mode))
                os.chown(target, st.st_uid, st.st_gid)
    return target


def _signature() -> str:
    """Names, sizes and times of what the caches depend on."""
    entries = []
    for source in SOURCES:
        paths = sorted(source.rglob("*")) if source.is_dir() else [source]
        for path in paths:
            if path.is_file():
                st = path.stat()
                entries.append(f"{path} {st.st_size} {st.st_mtime_ns}")
    return "\n".join(entries) + "\n"


def ensure_image(image: Path = IMAGE_DIR) -> Path | None:
    """The image layer, built if missing or stale; None where this host has no apt."""
    if not shutil.which("apt-cache"):
        return None
    image.parent.mkdir(parents=True, exist_ok=True)
    with open(image.parent / ".lab-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two labs coming up at once build it once
        return _build(image)


def _build(image: Path) -> Path:
    signature = _signature()
    stamp = image / ".signature"
    if stamp.is_file() and stamp.read_text() == signature:
        return image
    build = Path(tempfile.mkdtemp(prefix=".lab-image-", dir=image.parent))
    os.chmod(build, 0o755)
    cache = mkdirs_like_host(build, APT_CACHE)
    conf = mkdirs_like_host(build, str(Path(APT_CONF).parent)) / Path(APT_CONF).name
    conf.write_text(
        "// trainfleet lab: keep apt's caches (the host image turns them off)\n"
        'Dir::Cache::pkgcache "pkgcache.bin";\nDir::Cache::srcpkgcache "srcpkgcache.bin";\n'
    )
    subprocess.run(
        [
            "apt-cache",
            "-o",
            f"Dir::Cache={cache}",
            "-o",
            "Dir::Cache::pkgcache=pkgcache.bin",
            "-o",
            "Dir::Cache::srcpkgcache=srcpkgcache.bin",
            "gencaches",
        ],
        check=True,
        capture_output=True,
    )
    for name in ("pkgcache.bin", "srcpkgcache.bin"):
        os.chmod(cache / name, 0o644)
    (build / ".signature").write_text(signature)
    if image.exists():
        shutil.rmtree(image)
    build.rename(image)
    return image


def install_image(image: Path, upper: Path) -> None:
    """Put the image's files into a node's disk (its overlay upper layer): hard links, so 32
    nodes cost no copy. apt replaces a stale cache by writing a new file and renaming it over
    the link, so one node's rebuild never changes what the others or the image hold."""
    for source in sorted(image.rglob("*")):
        if not source.is_file() or source.name == ".signature":
            continue
        relative = source.relative_to(image)
        target = mkdirs_like_host(upper, str(relative.parent)) / relative.name
        try:
            os.link(source, target)
        except OSError:  # another filesystem: a copy
            shutil.copy2(source, target)
