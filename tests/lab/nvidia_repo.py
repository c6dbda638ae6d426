"""A local, signed apt repository whose packages carry NVIDIA's names and version strings.

CUDA cannot be installed here (no GPU, no network), but the pinning and hold mechanics
can be exercised with real apt and dpkg: this builds empty packages named and versioned
exactly as NVIDIA's CUDA repository names them (libnccl2 2.21.5-1+cuda12.4, libcudnn9-cuda-12
9.1.0.70-1, cuda-toolkit-12-4 12.4.1-1, cuda-drivers-550 550.54.15-1,
cuda-keyring 1.1-1), each also in a NEWER version, as
the real repository always has newer ones than a cluster's pin. Laid out as NVIDIA's flat
repos (``<root>/debian12/x86_64/`` with Packages and a signed InRelease), so the deploy's
``stack.cuda_repo`` points at it with ``cuda_repo: file://<root>`` like at a mirror. The
keyring package installs this repo's own test key where NVIDIA's cuda-keyring puts theirs.
The signing key is made per test run in a temporary GNUPGHOME and never leaves it; the deploy
is given its fingerprint, as a site whose mirror is signed by its own key would.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

DISTRO, ARCH = "debian12", "x86_64"
KEYRING = "/usr/share/keyrings/cuda-archive-keyring.gpg"  # where NVIDIA's cuda-keyring puts it

# (name, version, depends): the pinned versions first, then the newer ones apt would pick.
PINNED = {
    "libnccl2": "2.21.5-1+cuda12.4",
    "libnccl-dev": "2.21.5-1+cuda12.4",
    "libcudnn9-cuda-12": "9.1.0.70-1",
    "cuda-toolkit-12-4": "12.4.1-1",
    "cuda-drivers-550": "550.54.15-1",
}  # the driver branch's meta-package, as NVIDIA's repo versions it
NEWER = {
    "libnccl2": "2.23.4-1+cuda12.6",
    "libnccl-dev": "2.23.4-1+cuda12.6",
    "libcudnn9-cuda-12": "9.5.1.17-1",
    "cuda-toolkit-12-4": "12.4.1-2",
    "cuda-drivers-550": "550.90.07-1",
}


def _deb(
    out: Path, name: str, version: str, depends: str = "", files: dict[str, bytes] | None = None
) -> None:
    root = out / f"build-{name}-{version}"
    (root / "DEBIAN").mkdir(parents=True)
    for path, content in (files or {}).items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    control = (
        f"Package: {name}\nVersion: {version}\nArchitecture: "
        f"{'all' if name == 'cuda-keyring' else 'amd64'}\nMaintainer: trainfleet tests "
        "<tests@trainfleet.invalid>\n"
        + (f"Depends: {depends}\n" if depends else "")
        + f"Description: stand-in for NVIDIA's {name} (trainfleet lab test, empty)\n"
    )
    (root / "DEBIAN" / "control").write_text(control)
    subprocess.run(
        [
            "dpkg-deb",
            "--root-owner-group",
            "-Zgzip",
            "--build",
            str(root),
            str(out / f"{name}_{version}_{'all' if name == 'cuda-keyring' else 'amd64'}.deb"),
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(["rm", "-rf", str(root)], check=True)


def _gpg(home: Path, *args: str, input: bytes | None = None) -> bytes:
    return subprocess.run(
        [
            "gpg",
            "--homedir",
            str(home),
            "--batch",
            "--quiet",
            "--pinentry-mode",
            "loopback",
            "--passphrase",
            "",
            *args,
        ],
        input=input,
        check=True,
        capture_output=True,
    ).stdout


def build(root: Path) -> str:
    """Build the repo under ``root`` (the mirror root); returns its key's fingerprint, which the
    deploy checks the cuda-keyring package against (the spec's
    ``stack.cuda_keyring_fingerprint``)."""
    repo = root / DISTRO / ARCH
    repo.mkdir(parents=True)
    home = root.parent / "gnupg"
    home.mkdir(mode=0o700)
    try:
        _gpg(
            home,
            "--quick-gen-key",
            "trainfleet lab test repository <repo@trainfleet.invalid>",
            "ed25519",
            "sign",
            "never",
        )
        public = _gpg(home, "--export")
        colons = _gpg(home, "--with-colons", "--list-keys").decode()
        fingerprint = next(
            line.split(":")[9] for line in colons.splitlines() if line.startswith("fpr:")
        )
        _deb(repo, "cuda-keyring", "1.1-1", files={KEYRING: public})
        for versions in (PINNED, NEWER):
            _deb(repo, "libnccl2", versions["libnccl2"])
            _deb(
                repo,
                "libnccl-dev",
                versions["libnccl-dev"],
                depends=f"libnccl2 (= {versions['libnccl2']})",
            )
            _deb(repo, "libcudnn9-cuda-12", versions["libcudnn9-cuda-12"])
            _deb(repo, "cuda-toolkit-12-4", versions["cuda-toolkit-12-4"])
            _deb(repo, "cuda-drivers-550", versions["cuda-drivers-550"])
        packages = subprocess.run(
            ["dpkg-scanpackages", "--multiversion", "."], cwd=repo, check=True, capture_output=True
        ).stdout
        (repo / "Packages").write_bytes(packages)
        release = (
            f"Origin: trainfleet lab\nLabel: stand-in for NVIDIA CUDA {DISTRO} {ARCH}\n"
            f"Architectures: amd64 all\nDate: Sun, 22 Nov 2026 00:00:00 UTC\n"
            f"SHA256:\n {hashlib.sha256(packages).hexdigest()} {len(packages)} Packages\n"
        )
        (repo / "Release").write_text(release)
        (repo / "InRelease").write_bytes(
            _gpg(home, "--clearsign", "--output", "-", input=release.encode())
        )
    finally:  # gpg started an agent for this home: end it, leave no process behind
        subprocess.run(
            ["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"],
            check=False,
            capture_output=True,
        )
    os.chmod(root, 0o755)
    return fingerprint
