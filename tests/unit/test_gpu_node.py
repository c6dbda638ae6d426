"""GPU node settings: the GpuNodeState fact over real captured tool output, the plan's rules, the
drift properties and verdicts, and the operations against fact data (tests/fixtures/gpu_node)."""

from __future__ import annotations

import copy
import json
import stat
import subprocess
from pathlib import Path
from xml.sax.saxutils import escape

import pytest
from pyinfra_testing.facts import make_fact_tests
from pyinfra_testing.operations import make_operation_tests

from facts.gpu_node_facts import GpuNodeState
from facts.nccl_env_facts import NcclNetwork
from tests.unit.gpu_node_captures import CAPTURES, FIXTURES, SCENARIOS, run_scenario
from tests.unit.test_nccl_env import SYSFS
from trainfleet.capabilities import RULES, gpu_node
from trainfleet.capabilities.gpu_node import FabricManagerPlan, expected, gpu_part, observed
from trainfleet.compare import compare
from trainfleet.hw import smi_xml

TestGpuNodeState = make_fact_tests("facts", "gpu_node_facts.GpuNodeState", FIXTURES / "facts")
TestMemlock = make_operation_tests("operations", "gpu_node_ops.memlock", FIXTURES / "memlock")
TestPersistence = make_operation_tests(
    "operations", "gpu_node_ops.persistence", FIXTURES / "persistence"
)
TestPeermem = make_operation_tests("operations", "gpu_node_ops.peermem", FIXTURES / "peermem")
TestFabricManager = make_operation_tests(
    "operations", "gpu_node_ops.fabric_manager", FIXTURES / "fabric_manager"
)

GPU = {
    "persistence": True,
    "fabric_manager": "auto",
    "peermem": "auto",
    "memlock": "unlimited",
    "max_clock_offset_ms": 100,
}
ADDRESS = "198.18.0.11"
INTERFACE = "eth0"  # the interface holding ADDRESS, as the plan derives it


def fact(name: str) -> dict:
    return json.loads((FIXTURES / "facts" / f"{name}.json").read_text())["fact"]


def network(ports: list | None = None, mtu: int = 9000) -> dict:
    return {
        "interfaces": [
            {"name": "eno1", "addresses": ["203.0.113.9"], "bridge": False, "mtu": 1500},
            {"name": "eth0", "addresses": [ADDRESS], "bridge": False, "mtu": mtu},
        ],
        "ib_ports": ports or [],
    }


def port(device: str, state: str = "4:ACTIVE", mtu: int | None = 4096) -> dict:
    return {
        "device": device,
        "port": 1,
        "link_layer": "InfiniBand",
        "state": state,
        "gids": [],
        **({"active_mtu": mtu} if mtu else {}),
    }


# ---- the fact over real captures --------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_each_fixtures_output_is_what_the_script_prints_over_its_captures(name, tmp_path):
    output = run_scenario(tmp_path, SCENARIOS[name], timeout=2)
    recorded = json.loads((FIXTURES / "facts" / f"{name}.json").read_text())["output"]

    # `ulimit -l` is this machine's own answer, not the capture's
    def strip(lines: list[str]) -> list[str]:
        return [line for line in lines if not line.startswith("memlock ")]

    assert strip(output) == strip(recorded)
    assert any(line.startswith("memlock ") for line in output)


def test_the_hgx_capture_reads_a_persistent_gpu_and_its_fabric_and_the_nvswitches():
    hgx = fact("hgx_a100_converged")
    assert (hgx["smi"], hgx["driver"]) == ("ok", "535.54.03")
    assert hgx["gpus"] == [
        {
            "bus": "00000000:01:00.0",
            "persistence": "Enabled",
            "fabric_state": "N/A",
            "fabric_status": "N/A",
        }
    ]
    assert hgx["nvswitches"] == [
        "0000:05:00.0",
        "0000:06:00.0",
        "0000:07:00.0",
    ]  # not the GPUs, not the NIC
    assert hgx["peermem_loaded"] and hgx["peermem_boot"] == [
        "/etc/modules-load.d/trainfleet-peermem.conf"
    ]
    assert hgx["clock"]["offset_ms"] == pytest.approx(0.260112)


def test_a_pcie_node_has_no_nvswitch_and_a_fabric_that_is_not_applicable():
    pcie = fact("pcie_rtx4000_timesyncd_1s_slow")
    assert pcie["nvswitches"] == [] and {g["fabric_state"] for g in pcie["gpus"]} == {"N/A"}
    assert pcie["clock"]["offset_ms"] == pytest.approx(
        -1087.495
    )  # timesyncd's "Offset: -1.087495s"


# nvidia-smi -q -x of four drivers (DTD v12, v13, v11, none): the fields each element holds
XML_A100 = "nvidia-smi-q-x_a100-sxm4-80gb_535.54.03.xml"
XML_CAPTURES = {
    "nvidia-smi-q-x_a100-sxm4-80gb_535.54.03.xml": (
        "535.54.03",
        "00000000:01:00.0",
        "Disabled",
        "N/A",
        "N/A",
    ),
    "nvidia-smi-q-x_rtx-4000-sff-ada_595.84.xml": (
        "595.84",
        "00000000:06:00.0",
        "Enabled",
        "N/A",
        "N/A",
    ),
    "nvidia-smi-q-x_tesla-t4_515.105.01.xml": (
        "515.105.01",
        "00000000:00:1E.0",
        "Disabled",
        None,
        None,
    ),
    "nvidia-smi-q-x_gtx-1660-ti_418.43.xml": ("418.43", "00000000:43:00.0", "Disabled", None, None),
}


def smi_state(tmp_path: Path, xml: bytes) -> dict:
    """GpuNodeState's real script over a stub nvidia-smi printing ``xml``."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    capture = tmp_path / "smi.xml"
    capture.write_bytes(xml)
    return GpuNodeState().process(run_scenario(tmp_path / "run", {"smi": str(capture)}))


@pytest.mark.parametrize("name", sorted(XML_CAPTURES))
def test_each_field_is_read_from_its_own_element_of_real_xml_captures(name, tmp_path):
    state = smi_state(tmp_path, (CAPTURES / name).read_bytes())
    driver, bus, persistence, fabric_state, fabric_status = XML_CAPTURES[name]
    assert (state["smi"], state["driver"]) == ("ok", driver)
    assert state["gpus"] == [
        {
            "bus": bus,
            "persistence": persistence,
            "fabric_state": fabric_state,
            "fabric_status": fabric_status,
        }
    ]


def test_a_process_name_with_newlines_and_fake_fields_changes_nothing(tmp_path):
    # Any user names their process: lines that -q's text would have shown as the node's own driver
    # and persistence mode, and tags that would close the element (escaped, as nvidia-smi does).
    real = (CAPTURES / "nvidia-smi-q-x_rtx-4000-sff-ada_595.84.xml").read_bytes()
    forged = escape(
        "python\nDriver Version                            : 999\n"
        "    Persistence Mode                      : Disabled\n"
        "</process_name></process_info></processes><persistence_mode>Disabled</persistence_mode>"
        "</gpu><driver_version>999</driver_version>"
    )
    element = f"<process_name>{forged}</process_name>".encode()
    hostile = real.replace(b"<process_name>python</process_name>", element)
    assert hostile.count(b"Driver Version") == 1 and hostile != real
    forged_state = smi_state(tmp_path / "hostile", hostile)
    assert forged_state == smi_state(tmp_path / "real", real)
    assert (forged_state["driver"], forged_state["gpus"][0]["persistence"]) == ("595.84", "Enabled")


# Copies of the real captures with ONE line changed, a process name nvidia-smi printed as it
# came (tests/fixtures/gpu_node/README.md); whether it escapes one is open (docs/hardware.md).
FORGED_RESET = "nvidia-smi-q-x_rtx-4000-sff-ada_595.84_forged-name-reset.xml"
FORGED_GPU = "nvidia-smi-q-x_rtx-4000-sff-ada_595.84_forged-name-gpu.xml"
ODD_BYTES = "nvidia-smi-q-x_tesla-t4_515.105.01_name-not-utf8.xml"
RTX, T4 = "nvidia-smi-q-x_rtx-4000-sff-ada_595.84.xml", "nvidia-smi-q-x_tesla-t4_515.105.01.xml"


@pytest.mark.parametrize(("forged", "real"), [(FORGED_RESET, RTX), (ODD_BYTES, T4)])
def test_an_unescaped_process_name_neither_adds_an_element_nor_costs_the_gpus_facts(
    forged, real, tmp_path
):
    # the reset name closes its process list and adds a <gpu_reset_status> asking for a reset
    # (this driver prints none); the other holds bytes that are not UTF-8, a bare & and <
    document = (CAPTURES / forged).read_bytes()
    assert b"<gpu_reset_status>" in document or b"\xff" in document
    forged_state = smi_state(tmp_path / "forged", document)
    assert forged_state == smi_state(tmp_path / "real", (CAPTURES / real).read_bytes())
    assert forged_state["smi"] == "ok" and len(forged_state["gpus"]) == 1
    parsed = smi_xml.gpus(smi_xml.smi_root(document))
    assert parsed == smi_xml.gpus(smi_xml.smi_root((CAPTURES / real).read_bytes()))
    assert parsed[0]["reset_required"] is None


H200_NAMES = (
    Path(__file__).resolve().parents[1]
    / "fixtures"
    / "hardware"
    / "h200_process_names"
    / "nvidia-smi-q-x_odd-names.xml"
)


def test_the_lent_h200s_own_xml_with_odd_process_names_is_read_whole(tmp_path):
    # driver 580.159.04 escapes <, >, &, quotes in a name and prints bytes that are not UTF-8
    # as they are (tests/fixtures/hardware/h200_process_names/): read, its GPU's facts whole
    document = H200_NAMES.read_bytes()
    assert b"&lt;/process_name&gt;&lt;gpu_reset_status&gt;" in document
    assert b"\xff\xfe</process_name>" in document
    state = smi_state(tmp_path, document)
    assert (state["smi"], state["driver"]) == ("ok", "580.159.04")
    assert state["gpus"] == [
        {
            "bus": "00000000:00:06.0",
            "persistence": "Enabled",
            "fabric_state": "N/A",
            "fabric_status": "N/A",
        }
    ]
    (gpu,) = smi_xml.gpus(smi_xml.smi_root(document))
    assert (gpu["model"], gpu["reset_required"], gpu["recovery_action"]) == (
        "NVIDIA H200",
        None,
        "None",
    )


def test_a_process_name_that_frames_a_gpu_of_its_own_is_refused(tmp_path):
    state = smi_state(tmp_path, (CAPTURES / FORGED_GPU).read_bytes())
    assert state["smi"] == "refused: attached_gpus says 1, the document opens 2 GPUs"
    assert (state["driver"], state["gpus"]) == (None, [])
    assert gpu_node.persistence_value(state).startswith("unreadable (nvidia-smi refused: ")


def test_fewer_gpus_than_attached_are_read_only_where_no_process_is_listed():
    # telegraf's A100 capture says 4 attached and holds one, with <processes />: read; the T4's
    # list holds two processes: its count changed to 2, a name could have framed the other GPU
    assert len(smi_xml.gpus(smi_xml.smi_root((CAPTURES / XML_A100).read_bytes()))) == 1
    t4 = (CAPTURES / T4).read_bytes()
    one = b"<attached_gpus>1</attached_gpus>"
    assert t4.count(one) == 1
    with pytest.raises(ValueError, match="lists processes: a process name could have framed"):
        smi_xml.smi_root(t4.replace(one, b"<attached_gpus>2</attached_gpus>"))


@pytest.mark.parametrize(
    ("line", "twice"),
    [
        (b"<persistence_mode>Enabled</persistence_mode>", "gpu/persistence_mode"),
        (b"<driver_version>595.84</driver_version>", "nvidia_smi_log/driver_version"),
    ],
)
def test_a_tag_nvidia_smi_prints_once_appearing_twice_refuses_the_document(line, twice, tmp_path):
    # (the tags it does repeat, its supported clocks, are read in every capture above)
    real = (CAPTURES / RTX).read_bytes()
    assert real.count(line) == 1
    state = smi_state(tmp_path, real.replace(line, line + line))  # that ONE line twice
    assert state["smi"] == f"refused: <{twice}> appears twice: not nvidia-smi's document"
    assert state["gpus"] == []


BILLION_LAUGHS = (
    '<!DOCTYPE nvidia_smi_log [\n <!ENTITY a0 "lol">\n'
    + "".join(f' <!ENTITY a{i} "{f"&a{i - 1};" * 10}">\n' for i in range(1, 10))
    + "]>"
)


@pytest.mark.parametrize(
    "doctype",
    [
        BILLION_LAUGHS,
        '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd" [<!ENTITY v SYSTEM "file:///etc/hostname">]>',
        '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n<!DOCTYPE nvidia_smi_log '
        '[<!ENTITY v "999">]>',
    ],
)
def test_an_internal_dtd_or_entity_is_refused_and_the_gpu_checks_fail_closed(doctype, tmp_path):
    real = (CAPTURES / "nvidia-smi-q-x_a100-sxm4-80gb_535.54.03_persistence-on.xml").read_text()
    entity = "&a9;" if doctype == BILLION_LAUGHS else "&v;"
    hostile = real.replace('<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">', doctype, 1)
    hostile = hostile.replace(
        "<driver_version>535.54.03</driver_version>", f"<driver_version>{entity}</driver_version>"
    )
    state = smi_state(tmp_path, hostile.encode())
    assert state["smi"].startswith("refused: ") and (state["driver"], state["gpus"]) == (None, [])
    assert gpu_node.persistence_value(state).startswith("unreadable (nvidia-smi refused: ")
    assert gpu_node.fabric_manager_value(state).startswith("unreadable")
    plan = gpu_part(GPU, {"driver": "535"}, 1, {**state, "nvswitches": []}, None, "debian")
    # the deploy fails that node's GPU step
    assert any("nvidia-smi" in problem and "refused" in problem for problem in plan.problems)


def test_missing_tools_read_as_absent_and_a_hung_nvidia_smi_is_a_failure_not_a_pass():
    lab, hung = fact("lab_node_no_systemd"), fact("nvidia_smi_hangs")
    assert (lab["smi"], lab["systemd"], lab["clock"]["offset_ms"]) == ("absent", False, None)
    assert hung["smi"] == "failed (exit 124)" and hung["gpus"] == []
    assert gpu_node.persistence_value(hung).startswith("unreadable")
    assert GpuNodeState.default()["smi"] == "absent"


def test_a_line_a_tool_prints_cannot_pose_as_another_tools():
    # chronyc's output is prefixed "chrony ": a line inside it reading "memlock unlimited" stays
    # chrony's
    state = GpuNodeState().process(
        [
            "smi_rc absent",
            "chrony memlock unlimited unlimited",
            "chrony peermem_loaded yes",
            "memlock 64 64",
        ]
    )
    assert state["memlock"] == "64" and state["peermem_loaded"] is False


def test_the_network_fact_reads_each_interfaces_mtu_and_each_ports_active_mtu(tmp_path):
    tree = tmp_path / "sys"
    for name, mtu in (("eth0", "9000"), ("ib0", "4092")):
        (tree / "class/net" / name).mkdir(parents=True)
        (tree / "class/net" / name / "mtu").write_text(mtu + "\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "ibv_devinfo"
    stub.write_text(f"#!/bin/sh\ncat '{CAPTURES / 'ibv_devinfo_azure-hb120rs-v3.txt'}'\n")
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    script = NcclNetwork().command(sysfs=str(tree)).get_raw_value()
    out = subprocess.run(
        ["sh", "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
    ).stdout
    seen = NcclNetwork().process(
        out.splitlines() + ["port mlx5_0 1 InfiniBand 4:ACTIVE", "port mlx5_1 1 Ethernet 4:ACTIVE"]
    )
    assert {
        i["name"]: i.get("mtu") for i in seen["interfaces"] if i["name"] in ("eth0", "ib0")
    } == {"eth0": 9000, "ib0": 4092}
    assert {p["device"]: p["active_mtu"] for p in seen["ib_ports"]} == {
        "mlx5_0": 4096,
        "mlx5_1": 1024,
    }


def test_ib_ports_from_the_real_sysfs_trees_name_only_the_active_ones():
    from tests.unit.test_nccl_env import ib_ports

    assert gpu_node.active_ports({"ib_ports": ib_ports("ib_one_of_two_down")}) == ["mlx5_0:1"]
    assert gpu_node.active_ports({"ib_ports": ib_ports("ib_two_hcas")}) == ["mlx5_0:1", "mlx5_1:1"]
    assert SYSFS.is_dir()


# ---- the plan ---------------------------------------------------------------------------------


def test_an_nvswitch_node_wants_the_fabric_manager_at_exactly_its_running_drivers_version():
    plan = gpu_part(
        GPU, {"driver": "535"}, 8, fact("hgx_a100_converged"), network([port("mlx5_0")]), "debian"
    )
    assert plan.fabric_manager == FabricManagerPlan("nvidia-fabricmanager-535", "535.54.03")
    assert plan.persistence and plan.peermem and plan.driver == "535" and plan.problems == []
    rhel = gpu_part(GPU, {}, 8, fact("hgx_a100_converged"), None, "rhel")
    assert (
        rhel.fabric_manager == FabricManagerPlan("nvidia-fabric-manager", "535.54.03")
        and not rhel.peermem
    )
    assert (
        gpu_part(
            {**GPU, "fabric_manager": "off"}, {}, 8, fact("hgx_a100_converged"), None, "debian"
        ).fabric_manager
        is None
    )


def test_no_nvswitch_no_fabric_manager_and_no_active_port_no_peermem():
    plan = gpu_part(
        GPU,
        {},
        2,
        fact("pcie_rtx4000_timesyncd_1s_slow"),
        network([port("mlx5_0", "1:DOWN")]),
        "debian",
    )
    assert plan.fabric_manager is None and plan.peermem is False and plan.persistence is True


def test_nvswitches_without_a_readable_driver_are_a_problem_not_a_guess():
    hung = copy.deepcopy(fact("hgx_a100_converged"))
    hung["driver"] = None
    plan = gpu_part(
        GPU, {"driver": "535"}, 8, hung, None, "debian"
    )  # a branch pin names no exact version
    assert plan.fabric_manager is None and "driver version could not be read" in plan.problems[0]
    pinned = gpu_part(GPU, {"driver": "535.54.03"}, 8, hung, None, "debian")
    assert pinned.fabric_manager == FabricManagerPlan("nvidia-fabricmanager-535", "535.54.03")


def test_a_cpu_node_gets_memlock_only_and_null_leaves_memlock_unmanaged():
    cpu = gpu_part(
        GPU,
        {"driver": "535"},
        0,
        fact("cpu_node_chrony_7s_slow"),
        network([port("mlx5_0")]),
        "debian",
    )
    assert (cpu.persistence, cpu.fabric_manager, cpu.peermem, cpu.driver) == (
        False,
        None,
        False,
        None,
    )
    assert (
        "* soft memlock unlimited" in " ".join(cpu.memlock_conf.split())
        and "root hard memlock unlimited" in cpu.memlock_conf
    )
    assert expected(cpu) == {
        "memlock (non-login ssh)": "unlimited",
        "memlock file": gpu_node.digest(cpu.memlock_conf),
        "memlock set elsewhere": "none",
        "nvidia_peermem file": "absent",  # auto: trainfleet's own boot file has no place here
    }
    assert gpu_part({**GPU, "memlock": None}, {}, 0, None, None, None).memlock_conf is None
    assert gpu_part({**GPU, "memlock": 65536}, {}, 0, None, None, None).memlock == "65536"


# ---- drift ------------------------------------------------------------------------------------


def test_a_converged_hgx_node_matches_what_its_plan_expects():
    state = copy.deepcopy(fact("hgx_a100_converged"))
    state["memlock"] = "unlimited"
    plan = gpu_part(GPU, {}, 8, state, network([port("mlx5_0")]), "debian")
    state["memlock_conf"] = plan.memlock_conf
    seen = observed(state, network([port("mlx5_0")]), INTERFACE, 100)
    assert {prop: seen.get(prop) for prop in expected(plan)} == expected(plan)
    assert seen["fabric manager"] == "535.54.03, active, held"
    assert (seen["cluster MTU"], seen["ib ports active"], seen["ib active MTU"]) == (
        "9000",
        "mlx5_0:1",
        "mlx5_0:1 4096",
    )


def test_each_gpu_setting_off_spec_is_a_finding_with_both_values():
    state = copy.deepcopy(fact("hgx_a100_converged"))
    plan = gpu_part(GPU, {}, 8, state, network([port("mlx5_0")]), "debian")
    state["gpus"][0]["persistence"] = "Disabled"
    state["fabricmanager"] = {"nvidia-fabricmanager-535": "535.54.02-1"}
    state["peermem_loaded"] = False
    state["memlock"] = "8192"
    report = compare(
        "c",
        ["n1"],
        {"n1": observed(state, network([port("mlx5_0")]), INTERFACE, 100)},
        {"n1": expected(plan)},
        rules=RULES,
    )
    found = {f.property: (f.observed, f.expected) for f in report.findings}
    assert found["persistence mode"] == ("off on 1 of 1 GPUs", "on")
    assert found["fabric manager"] == ("535.54.02, active, held", "535.54.03, active, held")
    assert found["nvidia_peermem"] == ("not loaded, at boot", "loaded, at boot")
    assert found["memlock (non-login ssh)"] == ("8192", "unlimited")


def test_a_gpu_node_whose_nvidia_smi_hangs_or_vanished_fails_every_gpu_property():
    plan = gpu_part(GPU, {}, 8, fact("hgx_a100_converged"), network([port("mlx5_0")]), "debian")
    for state in (fact("nvidia_smi_hangs"), fact("lab_node_no_systemd")):
        report = compare(
            "c",
            ["n1"],
            {"n1": observed(state, network([port("mlx5_0")]), INTERFACE, 100)},
            {"n1": expected(plan)},
            rules=RULES,
        )
        assert {"persistence mode", "fabric manager", "nvidia_peermem", "clock offset"} <= {
            f.property for f in report.findings
        }


def test_the_odd_node_is_named_for_a_port_down_an_mtu_and_a_slow_clock():
    nodes = ["n1", "n2", "n3"]
    good = fact("hgx_a100_converged")
    slow = copy.deepcopy(good)
    slow["clock"]["offset_ms"] = -7810.5
    seen = {
        "n1": observed(good, network([port("mlx5_0"), port("mlx5_1")]), INTERFACE, 100),
        "n2": observed(slow, network([port("mlx5_0"), port("mlx5_1", "1:DOWN")]), INTERFACE, 100),
        "n3": observed(good, network([port("mlx5_0"), port("mlx5_1")], mtu=1500), INTERFACE, 100),
    }
    report = compare("c", nodes, seen, {}, rules=RULES)
    found = {(f.node, f.property): f.observed for f in report.findings}
    assert found == {
        ("n2", "ib ports active"): "mlx5_0:1",
        ("n2", "ib active MTU"): "mlx5_0:1 4096",
        ("n2", "clock offset"): "-7810 ms",
        ("n3", "cluster MTU"): "1500",
    }


def test_cpu_nodes_beside_gpu_nodes_are_not_compared_on_gpu_settings_and_lab_nodes_agree():
    seen = {
        "gpu": observed(fact("hgx_a100_converged"), network(), INTERFACE, 100),
        "cpu1": observed(fact("cpu_node_chrony_7s_slow"), network(), INTERFACE, 100),
        "cpu2": observed(fact("cpu_node_chrony_7s_slow"), network(), INTERFACE, 100),
    }
    assert "persistence mode" not in seen["cpu1"] and "persistence mode" in seen["gpu"]
    report = compare("c", list(seen), seen, {}, rules=RULES)
    gpu_only = {"persistence mode", "fabric manager", "nvidia_peermem"}
    assert not gpu_only & {
        f.property for f in report.findings
    }  # two CPU nodes do not outvote the GPU node
    assert ("gpu", "memlock file") in {
        (f.node, f.property) for f in report.findings
    }  # every node's is compared
    lab = {
        n: observed(fact("lab_node_no_systemd"), network(), INTERFACE, 100)
        for n in ("node1", "node2", "node3")
    }
    assert not compare("lab", list(lab), lab, {}, rules=RULES).findings
    assert lab["node1"]["clock sync"] == "none"
    assert lab["node1"]["clock offset"] == "not synchronised (no chrony or timesyncd active)"


# ---- the driver pin (the stack capability: trainfleet/pins.py, operations/stack_ops.py)
# -----------


def test_the_driver_pin_is_nvidias_cuda_drivers_meta_package_on_gpu_nodes_only():
    from trainfleet.capabilities.stack import stack_part
    from trainfleet.pins import package_pins

    assert package_pins({"driver": "550.54.15"}, "debian") == {"cuda-drivers-550": "550.54.15-1"}
    assert package_pins({"driver": "550"}, "debian") == {
        "cuda-drivers-550": None
    }  # newest of the branch, held
    assert package_pins({"driver": "550.54.15"}, "rhel") == {"cuda-drivers": "550.54.15-1"}
    with pytest.raises(ValueError, match="exact driver version"):
        package_pins({"driver": "550"}, "rhel")
    stack = {"cuda": "12.4", "driver": "550.54.15"}
    assert "cuda-drivers-550" in stack_part(stack, "debian", gpus=8).packages
    cpu = stack_part(stack, "debian", gpus=0)
    assert (
        "cuda-drivers-550" not in cpu.packages and "driver" not in cpu.pinned
    )  # what the deploy installs, too


def test_drift_takes_any_release_of_a_branch_pin_and_names_another_branch():
    from trainfleet.capabilities import pins_met
    from trainfleet.driver_pins import satisfies_driver

    assert satisfies_driver("550.54.15", "550") and not satisfies_driver("535.183.01", "550")
    plan = gpu_part(GPU, {"driver": "550"}, 8, fact("hgx_a100_converged"), None, "debian")
    assert plan.driver == "550"
    assert gpu_part(GPU, {"driver": "550"}, 0, None, None, "debian").driver is None
    assert pins_met({"gpu driver": "550.54.15"}, {"gpu driver": "550"}) == {
        "gpu driver": "550.54.15"
    }
    assert pins_met({"gpu driver": "535.183.01"}, {"gpu driver": "550"}) == {
        "gpu driver": "550"
    }  # a finding
    assert pins_met({"gpu driver": "none"}, {"gpu driver": "550"}) == {"gpu driver": "550"}
    assert pins_met({"python torch": "2.4.1+cu124"}, {"python torch": "2.4.1"}) == {
        "python torch": "2.4.1+cu124"
    }


def test_through_sudo_memlock_is_read_from_the_login_session_not_sudos_own(tmp_path):
    # A stand-in sudo (a shell named sudo) whose own limit is lowered, as sudo's PAM session
    # may set it: the fact must report the limit of the session above sudo (this test's).
    import resource
    import shutil

    fake_sudo = tmp_path / "sudo"
    shutil.copy("/bin/sh", fake_sudo)
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    command = str(GpuNodeState().command(root=str(tmp_path / "root")).get_raw_value())

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 * 1024, hard))

    def run(env: dict[str, str]) -> dict:
        out = subprocess.run(
            [str(fake_sudo), "-c", command],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", **env},
            preexec_fn=lower,
        )
        return GpuNodeState().process(out.stdout.splitlines())

    def kib(limit: int) -> str:
        return "unlimited" if limit == resource.RLIM_INFINITY else str(limit // 1024)

    through_sudo = run({"SUDO_UID": "1000"})
    assert (through_sudo["memlock"], through_sudo["memlock_hard"]) == (kib(soft), kib(hard))
    assert run({})["memlock"] == "64"  # without sudo: this session's own limit


def test_an_unsynchronised_chrony_reporting_zero_offset_is_not_within_the_bound():
    state = copy.deepcopy(fact("hgx_a100_converged"))
    state["clock"].update({"leap": "Not synchronised", "offset_ms": 0.0})
    assert gpu_node.clock_offset_value(state, 100) == "not synchronised"
    assert gpu_node.clock_sync_value(state) == "chrony not synchronised"
    state["clock"]["chrony"] = False  # nor timesyncd active: nothing measured the clock
    state["units"].pop("systemd-timesyncd", None)
    assert gpu_node.clock_offset_value(state, 100).startswith("not synchronised")


def test_a_site_file_setting_memlock_for_the_ranks_is_read_and_named_by_drift(tmp_path):
    # pam_limits lets a later file's line win over ours for every user but root: the check
    # that reads root's (or the login's) limit cannot see it, so such lines are listed.
    limits = tmp_path / "etc/security/limits.d"
    limits.mkdir(parents=True)
    (limits / "95-site.conf").write_text(
        "# site\n*    hard   memlock   65536   # for the DB\n@hpc - nofile 4096\n"
    )
    (limits / "90-trainfleet-memlock.conf").write_text("* soft memlock unlimited\n")
    (tmp_path / "etc/security/limits.conf").write_text("#*  soft  memlock  1\n")
    command = str(GpuNodeState().command(root=str(tmp_path)).get_raw_value())
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
    state = GpuNodeState().process(out.stdout.splitlines())
    assert state["memlock_other"] == ["/etc/security/limits.d/95-site.conf: * hard memlock 65536"]
    cpu = gpu_part(GPU, {}, 0, state, network(), "debian")
    seen = observed(state, network(), INTERFACE, 100)
    assert (
        seen["memlock set elsewhere"] == "/etc/security/limits.d/95-site.conf: * hard memlock 65536"
    )
    assert [
        (f.property, f.expected)
        for f in compare("c", ["n"], {"n": seen}, {"n": expected(cpu)}, rules=RULES).findings
        if f.property == "memlock set elsewhere"
    ] == [("memlock set elsewhere", "none")]


def test_a_fabric_manager_dev_package_beside_the_daemon_is_not_judged():
    state = copy.deepcopy(fact("hgx_a100_converged"))
    value = gpu_node.fabric_manager_value(state)
    ((name, version),) = state["fabricmanager"].items()
    state["fabricmanager"][name.replace("fabricmanager", "fabricmanager-dev")] = (
        version  # installed, not held
    )
    assert (
        gpu_node.fabric_manager_value(state) == value
        and "not held" not in value
        and ", held" in value
    )
