"""NVIDIA's CUDA package repository: the cuda-keyring package (its key checked first) and the
apt list, or the yum/dnf .repo file, each as the plan rendered it (``StackPlan.repo_files``,
templates/stack/)."""

from __future__ import annotations

from urllib.parse import urlsplit

from pyinfra import host
from pyinfra.api import StringCommand, operation

from facts.shell import shell
from operations.packages_ops import APT
from operations.remote import fail_command, script, write_file_command
from operations.stack_state import stack_fact, unsupported
from trainfleet.capabilities.stack import StackPlan
from trainfleet.defaults import CUDA_KEYRING_DEB, CUDA_REPOS
from trainfleet.grammar import fingerprint_problem, url_problem

NVIDIA_REPOS = CUDA_REPOS
KEYRING_DEB = CUDA_KEYRING_DEB

# Fetch the keyring .deb ($1, over the scheme $3 only, redirects included where curl does it),
# check that the keyring inside holds exactly one key, fingerprint $2, and only then dpkg -i it.
# mktemp -d: a fresh 0700 directory of root's under an unguessable name, so no other user can
# place, swap or read the file between the download, the check and the install.
_KEYRING = script("stack_cuda_keyring.sh")


def mirror_problem(mirror: str, insecure: bool = False) -> str | None:
    """Why the repos root ``mirror`` may not be used: the spec's URL grammar (https, or file://
    on the node), and http only with ``insecure`` (the spec's ``stack.insecure: true``).
    Checked here too because an operation can be called without a spec."""
    if urlsplit(mirror).scheme not in ("https", "http", "file"):
        return f"{mirror} is not an https:// (or file://) URL"
    if problem := url_problem(mirror, file_ok=True):
        return problem
    if mirror.startswith("http://") and not insecure:
        return (
            f"{mirror} is plain http: the CUDA keyring and repository are fetched over https only "
            "(set stack.insecure: true to allow this mirror)"
        )
    return None


def keyring_install(url: str, fingerprint: str) -> StringCommand:
    """Download the keyring .deb from ``url``, check its key, install it (``_KEYRING``)."""
    return shell(_KEYRING, url, fingerprint, urlsplit(url).scheme)


@operation()
def cuda_repo(stack: StackPlan):
    """
    Configure NVIDIA's CUDA package repository (apt: keyring package + sources list;
    RHEL: .repo file), as the node's plan says.

    + stack: the node's ``StackPlan``: ``cuda_repo`` (the repos root, https or ``file://``;
      ``http://`` only with ``insecure``), ``keyring_fingerprint`` (the one key the
      ``cuda-keyring`` .deb may hold, checked before ``dpkg -i``), and what the plan rendered
      for the node's OS: ``cuda_repo_url`` (``<cuda_repo>/<distro>/<arch>``) and
      ``repo_files`` (the apt list or the .repo file: path -> text)

    The apt list is ``/etc/apt/sources.list.d/cuda-<distro>-<arch>.list``, the file the
    ``cuda-keyring`` package itself writes, so the official URL converges with no change.
    The .repo file keeps ``gpgcheck=1``; its ``gpgkey`` is under the mirror (https unless insecure).

    **Example:**

    .. code:: python

        stack_repo_ops.cuda_repo(name="CUDA repository", stack=plan.stack)
    """
    problem = mirror_problem(stack.cuda_repo, stack.insecure) or fingerprint_problem(
        stack.keyring_fingerprint
    )
    if problem:
        yield fail_command(f"cuda_repo: {problem}")
        return
    current = stack_fact()
    os_ = current["os"]
    if os_["package_manager"] is None:
        yield unsupported(os_, "cuda_repo")
        return
    base = stack.cuda_repo_url
    if base is None or not stack.repo_files:
        yield fail_command(f"cuda_repo: no NVIDIA repo name for {os_['id']} {os_['version']}")
        return
    commands: list[StringCommand] = []
    if os_["family"] == "debian" and not current["keyring"]:
        commands.append(keyring_install(f"{base}/{KEYRING_DEB}", stack.keyring_fingerprint))
    commands += [
        write_file_command(path, text)
        for path, text in stack.repo_files.items()
        if current["repos"].get(path) != text
    ]
    if commands and os_["family"] == "debian":
        commands.append(StringCommand(APT, "update", "-q"))
    if not commands:
        host.noop(f"CUDA repository {base} is configured")
        return
    yield from commands
