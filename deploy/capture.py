"""A hardware capture, read-only: ``pyinfra inventories/prod.py deploy/capture.py``.

Each node's hardware sources (``nvidia-smi -q -x``, ``nvidia-smi nvlink -s``, ``nvidia-smi
topo -m``, ``lspci -vvv``, the kernel log since boot, ``/proc/cmdline``, ``/proc/cpuinfo``,
the InfiniBand sysfs tree) are read in one command per node and saved under
``.trainfleet/captures/<cluster>/<UTC time>/<node>/``, one file per source (docs/hardware.md);
the path is printed. ``trainfleet diagnose DIR [--spec SPEC]`` judges it offline with the code
drift runs live. A node that cannot be read fails the run. Nothing on any node is changed.
"""

from checks import capture_save
from operations import verdict
from runtime.gather import this_node

cluster, node = this_node()

directory, missing = capture_save.cluster_capture(cluster)
verdict.verdict(
    name="Hardware captured",
    check="capture",
    problems=[f"not captured: {missing[node.name]}"] if node.name in missing else [],
    passed=f"captured in {directory / node.name}",
)
