"""Version pinning as data: the exact packages and the exact torch build a spec pins.

Plain functions of the spec's ``stack`` section; operations/stack_ops.py installs and holds
them, drift expects them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from trainfleet.grammar import normalized_dist

# Package names per OS family: (runtime, dev) of NCCL; cuDNN >= 9 is libcudnnN-cuda-<CUDA major>;
# OpenMPI's mpirun (its libraries come with it as dependencies).
_NCCL = MappingProxyType(
    {"debian": ("libnccl2", "libnccl-dev"), "rhel": ("libnccl", "libnccl-devel")}
)
_OPENMPI = MappingProxyType({"debian": "openmpi-bin", "rhel": "openmpi"})
# The names package_pins gives, as a regex.
PINNED_PACKAGES = r"^(cuda-toolkit-|libcudnn|libnccl|openmpi|cuda-drivers)"

Pins = dict[str, str | None]  # package name -> exact version; None: any version (the name pins it)


def package_pins(stack: Mapping[str, str | None], family: str) -> Pins:
    """The exact packages for the spec's ``stack`` section on an OS ``family`` (debian | rhel).

    ``{"cuda": "12.4", "cudnn": "9.1.0.70", "nccl": "2.21.5-1"}`` on debian gives
    ``{"cuda-toolkit-12-4": None, "libcudnn9-cuda-12": "9.1.0.70-1",
    "libnccl2": "2.21.5-1+cuda12.4", "libnccl-dev": "2.21.5-1+cuda12.4"}``. A cuda of
    ``12.4.1`` pins ``cuda-toolkit-12-4=12.4.1-1``. A value with a ``-`` release is taken as is.
    ``openmpi: 4.1.4-3+b1`` pins ``openmpi-bin`` (``openmpi`` on rhel) at exactly that version.
    Raises ValueError when cuDNN or NCCL is pinned without the CUDA version they are built for.
    """
    cuda, cudnn, nccl = stack.get("cuda"), stack.get("cudnn"), stack.get("nccl")
    pins: Pins = {}
    cuda_parts = cuda.split(".") if cuda else []
    if (cudnn or nccl) and len(cuda_parts) < 2:
        raise ValueError(
            "cudnn and nccl packages are built per CUDA version: pin stack.cuda too, e.g. 12.4"
        )
    if cuda:
        name = f"cuda-toolkit-{cuda_parts[0]}-{cuda_parts[1]}"
        pins[name] = None if len(cuda_parts) == 2 else _release(cuda, "-1")
    if cudnn:
        major = cudnn.split(".")[0]
        if int(major) >= 9:
            pins[f"libcudnn{major}-cuda-{cuda_parts[0]}"] = _release(cudnn, "-1")
        else:  # cuDNN 8 carries the CUDA it was built for in the version
            pins[f"libcudnn{major}"] = _release(cudnn, f"-1+cuda{cuda_parts[0]}.{cuda_parts[1]}")
    if nccl:
        build = f"+cuda{cuda_parts[0]}.{cuda_parts[1]}"  # the CUDA the NCCL package was built for
        version = nccl if "+" in nccl else _release(nccl, "-1") + build
        for name in _NCCL[family]:
            pins[name] = version
    if stack.get("openmpi"):
        pins[_OPENMPI[family]] = stack["openmpi"]
    if driver := stack.get("driver"):
        pins.update(driver_pins(driver, family))
    return pins


def driver_pins(driver: str, family: str) -> Pins:
    """The NVIDIA driver from NVIDIA's CUDA repository, as its install guide installs a branch:
    the ``cuda-drivers-<branch>`` meta-package on apt (it pulls that branch's driver, utilities
    and libraries together, so they cannot drift apart), at ``<version>-1`` for an exact pin
    (any release of the branch, held, for a branch pin). On dnf the branch is a module stream
    (``nvidia-driver:550-dkms``), which trainfleet does not switch: an exact ``cuda-drivers``
    version is pinned and version-locked, a branch pin is refused.
    """
    exact = "." in driver
    if family == "debian":
        return {f"cuda-drivers-{driver.split('.')[0]}": f"{driver}-1" if exact else None}
    if not exact:
        raise ValueError(
            f"stack.driver {driver!r}: on RHEL-family nodes pin an exact driver version "
            "(e.g. 550.54.15); branches are dnf module streams, not switched by trainfleet"
        )
    return {"cuda-drivers": f"{driver}-1"}


def _release(version: str, suffix: str) -> str:
    return version if "-" in version else version + suffix


def torch_requirement(torch_version: str, variant: str) -> str:
    """``torch==2.4.1+cu124``: the exact build ``torch.__version__`` reports."""
    return f"torch=={torch_version if '+' in torch_version else f'{torch_version}+{variant}'}"


def venv_pins(python: Mapping[str, Any]) -> dict[str, str]:
    """The spec's ``stack.python`` as PEP 503 name -> exact version."""
    return {
        normalized_dist(name): pin["version"] if isinstance(pin, Mapping) else pin
        for name, pin in sorted(python.items())
    }


def without_requirements(python: Mapping[str, Any]) -> list[str]:
    """The ``stack.python`` packages pinned with ``deps: false`` (PEP 503 names)."""
    return sorted(
        normalized_dist(name)
        for name, pin in python.items()
        if isinstance(pin, Mapping) and pin.get("deps") is False
    )


def satisfies(installed: str, pin: str) -> bool:
    """Whether ``installed`` is what pip's ``==pin`` accepts (PEP 440): ``1.0`` is ``1.0.0``, and
    a pin without a local label accepts any (``0.19.1`` is ``0.19.1+cu124``)."""
    try:
        return SpecifierSet(f"=={pin}").contains(installed, prereleases=True)
    except InvalidSpecifier:
        return installed == pin
