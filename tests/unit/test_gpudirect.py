"""GPUDirect RDMA either way (#40): DMA-BUF (the open kernel module on Linux 5.12 or later) or
nvidia_peermem, read from real ``/proc/driver/nvidia/version`` captures (the lent H100's open
module, a proprietary 535 one) and the kernel release; a reading that cannot be parsed is
named, never assumed; ``gpu.peermem: on``/``off`` still decide; a node converged under the old
rule keeps its loaded module and loses only trainfleet's boot file, once.

Faulty variants (one line changed each, tests/fixtures/gpu_node/README.md): the H100's kernel
release ``6.18.44-fc-v657-gpu`` -> ``5.4.0-42-generic``; the H100's version line emptied."""

from __future__ import annotations

import copy
from pathlib import Path

from facts.gpu_node_facts import GpuNodeState
from tests.unit.gpu_node_captures import CAPTURES, H100, H100_RELEASE, SCENARIOS, run_scenario
from tests.unit.test_gpu_node import GPU, INTERFACE, fact, network, port
from trainfleet.capabilities import RULES
from trainfleet.capabilities.gpu_node import expected, gpu_part, observed
from trainfleet.compare import compare
from trainfleet.hw.gpudirect import DMA_BUF, PEERMEM, UNKNOWN, gdr_path

OPEN_LINE = (H100 / "nvidia-driver-version.txt").read_text().splitlines()[0]
PROPRIETARY = CAPTURES / "proc-driver-nvidia-version_proprietary_535.161.08.txt"
PROPRIETARY_LINE = PROPRIETARY.read_text().splitlines()[0]
IB = network([port("mlx5_0")])


def test_the_lent_h100s_open_module_on_linux_6_18_offers_dma_buf():
    path = gdr_path(OPEN_LINE, H100_RELEASE)
    assert (path.kind, path.module) == (DMA_BUF, "open")
    assert path.value() == "DMA-BUF (open kernel module, kernel 6.18.44-fc-v657-gpu)"


def test_the_proprietary_module_needs_peermem_whatever_the_kernel():
    for release in (H100_RELEASE, None):
        path = gdr_path(PROPRIETARY_LINE, release)
        assert (path.kind, path.module) == (PEERMEM, "proprietary"), release
    assert gdr_path(PROPRIETARY_LINE, None).value() == (
        "nvidia_peermem (proprietary kernel module: no DMA-BUF)"
    )


def test_the_open_module_on_a_kernel_before_5_12_needs_peermem():
    # the H100's release, one line changed: an Ubuntu 20.04 kernel
    path = gdr_path(OPEN_LINE, "5.4.0-42-generic")
    assert path.kind == PEERMEM and "kernel 5.4.0-42-generic older than 5.12" in path.why


def test_a_reading_that_cannot_be_parsed_is_unknown_and_says_why():
    assert gdr_path(None, H100_RELEASE).kind == UNKNOWN
    assert "version not read (no NVIDIA driver loaded" in gdr_path(None, H100_RELEASE).why
    emptied = gdr_path("", H100_RELEASE)  # the H100's version line emptied
    assert emptied.kind == UNKNOWN and "unparsable" in emptied.why
    no_kernel = gdr_path(OPEN_LINE, None)
    assert no_kernel.kind == UNKNOWN and "kernel release not read" in no_kernel.why
    assert "unparsable: 'x'" in gdr_path(OPEN_LINE, "x").why


def test_the_fact_reads_the_version_line_and_the_kernel_release_in_its_one_command(tmp_path):
    h100 = fact("h100_open_module_converged_under_peermem")
    assert h100["nvidia_version"] == OPEN_LINE.strip() and h100["kernel"] == H100_RELEASE
    emptied = tmp_path / "version"
    lines = (H100 / "nvidia-driver-version.txt").read_text().splitlines(keepends=True)
    emptied.write_text("\n" + "".join(lines[1:]))  # ONE line changed: the NVRM line emptied
    scenario = {**SCENARIOS["h100_open_module_converged_under_peermem"], "nvidia_version": emptied}
    state = GpuNodeState().process(run_scenario(tmp_path / "run", scenario))
    plan = gpu_part(GPU, {}, 1, state, IB, "debian")
    assert not plan.peermem and plan.peermem_retired is None  # neither loaded nor retired
    assert plan.problems == [
        "GPUDirect RDMA: DMA-BUF or nvidia_peermem cannot be told apart here "
        "(/proc/driver/nvidia/version unparsable: ''); nvidia_peermem was neither loaded nor "
        "retired: re-run once the NVIDIA driver is loaded, or set gpu.peermem to on or off"
    ]


def test_dma_buf_neither_loads_nor_wants_peermem_and_drift_says_so():
    state = fact("h100_open_module_converged_under_peermem")
    plan = gpu_part(GPU, {}, 1, state, IB, "debian")
    assert (plan.peermem, plan.peermem_conf, plan.problems) == (False, None, [])
    assert plan.peermem_retired == "nvidia_peermem\n"
    seen = observed(state, IB, INTERFACE, 100)
    assert seen["GPUDirect RDMA"] == "DMA-BUF (open kernel module, kernel 6.18.44-fc-v657-gpu)"
    assert seen["nvidia_peermem"] == "not needed (DMA-BUF); loaded, at boot"
    assert "nvidia_peermem" not in expected(plan)
    # converged under the old rule: trainfleet's own boot file is the one finding
    report = compare("c", ["n1"], {"n1": seen}, {"n1": expected(plan)}, rules=RULES)
    assert [(f.property, f.expected) for f in report.findings if "peermem" in f.property] == [
        ("nvidia_peermem file", "absent")
    ]
    # after the deploy removed it: the module stays loaded, nothing is a finding
    after = copy.deepcopy(state)
    after["peermem_conf"], after["peermem_boot"] = None, []
    seen = observed(after, IB, INTERFACE, 100)
    assert seen["nvidia_peermem"] == "not needed (DMA-BUF); loaded"
    report = compare("c", ["n1"], {"n1": seen}, {"n1": expected(plan)}, rules=RULES)
    assert not [f for f in report.findings if "peermem" in f.property or "GPUDirect" in f.property]


def test_the_proprietary_module_with_an_active_port_wants_peermem_as_before():
    plan = gpu_part(GPU, {}, 8, fact("hgx_a100_converged"), IB, "debian")
    assert plan.peermem and plan.peermem_conf == "nvidia_peermem\n" and not plan.peermem_retired
    assert plan.gdr is not None and plan.gdr.kind == PEERMEM
    assert expected(plan)["nvidia_peermem"] == "loaded, at boot"
    seen = observed(fact("hgx_a100_converged"), IB, INTERFACE, 100)
    assert seen["GPUDirect RDMA"] == "nvidia_peermem (proprietary kernel module: no DMA-BUF)"


def test_an_explicit_setting_still_decides_whatever_the_path():
    h100 = fact("h100_open_module_converged_under_peermem")
    on = gpu_part({**GPU, "peermem": "on"}, {}, 1, h100, None, "debian")
    assert on.peermem and on.peermem_conf == "nvidia_peermem\n" and not on.peermem_retired
    assert expected(on)["nvidia_peermem"] == "not needed (DMA-BUF); loaded, at boot"
    unread = copy.deepcopy(h100)
    unread["nvidia_version"] = None  # no driver loaded: auto cannot decide, on/off can
    for setting, wanted in (("on", True), ("off", False)):
        plan = gpu_part({**GPU, "peermem": setting}, {}, 1, unread, IB, "debian")
        assert (plan.peermem, plan.problems, plan.peermem_retired) == (wanted, [], None)
    # auto without a driver loaded (a first deploy): peermem waits, neither loaded nor retired,
    # and the rest of the GPU settings go ahead; a line that cannot be parsed fails them
    waiting = gpu_part(GPU, {}, 1, unread, IB, "debian")
    assert (waiting.peermem, waiting.peermem_retired, waiting.problems) == (False, None, [])
    assert observed(unread, IB, INTERFACE, 100)["GPUDirect RDMA"].startswith("unknown (")
    garbled = {**unread, "nvidia_version": "NVRM version: something else"}
    problems = gpu_part(GPU, {}, 1, garbled, IB, "debian").problems
    assert problems and problems[0].startswith("GPUDirect RDMA:")
    # a CPU node under auto: trainfleet's file has no place there; under off: unmanaged
    assert gpu_part(GPU, {}, 0, None, IB, None).peermem_retired == "nvidia_peermem\n"
    assert gpu_part({**GPU, "peermem": "off"}, {}, 0, None, IB, None).peermem_retired is None


def test_the_captures_are_the_files_the_readme_names():
    assert (
        Path(PROPRIETARY)
        .read_text()
        .startswith("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08")
    )
    assert OPEN_LINE.startswith("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64")


def test_a_real_h200_with_the_open_module_offers_dma_buf_as_its_driver_and_kernel_say():
    """tests/fixtures/hardware/h200_rdma: captured on a lent H200 on 2026-11-28. The version
    line and kernel release alone decide DMA-BUF here; the same machine's CUDA driver reports
    CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 1 and its kernel exports ib_umem_dmabuf_get, which
    is what the rule stands for."""
    h200 = Path(__file__).resolve().parents[1] / "fixtures" / "hardware" / "h200_rdma"
    line = (h200 / "nvidia-driver-version.txt").read_text().splitlines()[0]
    path = gdr_path(line, (h200 / "uname-r.txt").read_text())
    assert (path.kind, path.module) == (DMA_BUF, "open")
    assert path.why == "open kernel module, kernel 6.18.44-fc-v657-gpu"
    attributes = (h200 / "cuda-rdma-attributes.txt").read_text()
    assert "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 124 rc 0 value 1" in attributes
    assert "T ib_umem_dmabuf_get " in (h200 / "kallsyms-dmabuf.txt").read_text()
