"""The node venv: exactly ``torch==<version>+<variant>`` (from the variant's index, a mirror
of it, or a wheelhouse on the node), and the Python packages pinned beside it, torch kept."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from pyinfra import host
from pyinfra.api import OperationValueError, QuoteString, StringCommand, operation

from operations.packages_ops import or_fail
from operations.remote import fail_command
from operations.stack_state import stack_fact
from trainfleet.pins import satisfies, torch_requirement

TORCH_INDEX = "https://download.pytorch.org/whl"


@operation()
def torch_venv(
    venv: str,
    torch_version: str,
    variant: str,
    index_url: str | None = None,
    wheelhouse: str | None = None,
    python: str = "python3",
    allow_change: bool = False,
):
    """
    Create the node venv and install exactly ``torch==<version>+<variant>`` in it.

    + venv: the venv directory, e.g. ``"/opt/trainfleet/venv"`` (``trainfleet.defaults.VENV_DIR``)
    + torch_version: e.g. ``"2.4.1"`` (``"2.4.1+cu124"`` is taken as is)
    + variant: the CUDA variant of the wheel index, e.g. ``"cu124"`` or ``"cpu"``
    + index_url: a mirror of the variant's index; default ``https://download.pytorch.org/whl/<variant>``
    + wheelhouse: for air-gapped clusters, a directory on the node holding the wheels, e.g.
      ``"/srv/wheels"``: installs with ``--no-index --find-links``. Excludes ``index_url``.
    + python: the interpreter that creates the venv, e.g. ``"python3.11"``

    Nothing happens when the venv's torch already reports exactly that version.

    **Example:**

    .. code:: python

        stack_venv_ops.torch_venv(
            name="torch venv", venv=VENV_DIR, torch_version="2.4.1", variant="cu124"
        )
    """
    if index_url and wheelhouse:
        raise OperationValueError("torch_venv: give index_url or wheelhouse, not both")
    requirement = torch_requirement(torch_version, variant)
    current = stack_fact(venv)
    have = (current["torch"] or {}).get("version")
    if current["venv"] and have == requirement.split("==", 1)[1]:
        host.noop(f"torch {have} is installed in {venv}")
        return
    if have and not allow_change:
        yield fail_command(
            f"torch_venv: {venv} has torch {have}, the pin is {requirement.split('==', 1)[1]}; "
            "not replacing it (set stack.allow_change to replace)"
        )
        return
    if not current["venv"]:
        yield StringCommand(
            QuoteString(python),
            "-m",
            "venv",
            QuoteString(venv),
            *or_fail(f"torch_venv: {python} -m venv failed (is python3-venv installed?)"),
        )
    if wheelhouse:
        source = ["--no-index", "--find-links", QuoteString(wheelhouse)]
    else:
        source = ["--index-url", QuoteString(index_url or f"{TORCH_INDEX}/{variant}")]
    yield StringCommand(
        QuoteString(f"{venv}/bin/python"),
        "-m",
        "pip",
        "install",
        "--no-input",
        QuoteString(requirement),
        *source,
    )


@operation()
def python_packages(
    venv: str,
    packages: Mapping[str, str],
    keep: str | None = None,
    wheelhouse: str | None = None,
    allow_change: bool = False,
    no_deps: Collection[str] = (),
):
    """
    Install Python packages in the node venv at exactly the given versions.

    + venv: the node venv (made by ``torch_venv``), e.g. ``"/opt/trainfleet/venv"``
    + packages: PEP 503 name -> exact version,
      e.g. ``{"accelerate": "1.15.0", "deepspeed": "0.19.8"}``
    + keep: ``torch==<build>``, given to pip beside them so that no package's
      requirement can move torch
    + wheelhouse: a directory on the node holding the wheels (``--no-index --find-links``);
      None: the node's pip index (PyPI, or its pip.conf mirror)
    + allow_change: replace a package installed at another version; without it the node fails
      with every such package named, and nothing changes
    + no_deps: packages installed without their requirements (``pip install --no-deps``), after
      the others: ColossalAI 0.5.0 requires torch<=2.5.1, yet its runner works beside a newer one

    **Example:**

    .. code:: python

        stack_venv_ops.python_packages(
            name="venv packages", venv=VENV_DIR, packages={"deepspeed": "0.19.8"}
        )
    """
    current = stack_fact(venv)
    have = current["venv_packages"]
    missing = {name: version for name, version in packages.items() if name not in have}
    changes = {
        name: version
        for name, version in packages.items()
        if name in have and not satisfies(have[name], version)
    }
    if changes and not allow_change:
        yield fail_command(
            "python_packages: not changing installed versions (set stack.allow_change to replace): "
            + "; ".join(
                f"{name} is {have[name]} in {venv}, the pin is {version}"
                for name, version in changes.items()
            )
        )
        return
    wanted = {**missing, **changes}
    if not wanted:
        host.noop(
            f"{venv} has "
            + (", ".join(f"{n} {v}" for n, v in packages.items()) or "no other pinned package")
        )
        return
    source = ["--no-index", "--find-links", QuoteString(wheelhouse)] if wheelhouse else []
    keep_torch = [QuoteString(keep)] if keep else []
    pip = [QuoteString(f"{venv}/bin/python"), "-m", "pip", "install", "--no-input"]
    resolved = {name: version for name, version in sorted(wanted.items()) if name not in no_deps}
    alone = {name: version for name, version in sorted(wanted.items()) if name in no_deps}
    if resolved:
        yield StringCommand(
            *pip,
            *(QuoteString(f"{name}=={version}") for name, version in resolved.items()),
            *keep_torch,
            *source,
        )
    if alone:
        yield StringCommand(
            *pip,
            "--no-deps",
            *(QuoteString(f"{name}=={version}") for name, version in alone.items()),
            *source,
        )
