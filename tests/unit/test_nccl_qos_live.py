"""The deploy's NCCL_IB_TC from the host's own QoS (#40): each node's NcclNetwork fact, read by
its real script over a real ConnectX-6 RoCE tree (tests/unit/test_fabric_sources.py's
roce_node: its GID table, ucx#11105's global traffic class, spiderpool's ECN and ToS) with
netarbiter's real ``mlnx_qos`` output (PFC on priority 3, dscp trust); one node's copy has its
PFC row changed (one line). Derived as the deploy derives (trainfleet.nccl_cluster), compared
as drift compares (the nccl_env capability's properties, trainfleet.compare)."""

from __future__ import annotations

from facts.nccl_env_facts import NcclNetwork
from tests.unit.test_fabric_sources import network_script, quoted, roce_node
from tests.unit.test_nccl_qos import PFC3, PFC4, netarbiter
from trainfleet.capabilities import RULES
from trainfleet.capabilities.nccl_env import nccl_part, qos_observed
from trainfleet.compare import compare
from trainfleet.nccl_cluster import derive_cluster
from trainfleet.spec import parse_cluster

SPEC = """
cluster: {name: roce}
nodes:
  - {name: n1, address: 198.18.0.11, gpus: 0}
  - {name: n2, address: 198.18.0.12, gpus: 0}
  - {name: n3, address: 198.18.0.13, gpus: 0}
"""


def live_network(tmp, name: str, mlnx_qos_text: str, address: str) -> dict:
    (tmp / name).mkdir()
    (tmp / f"{name}.qos").write_text(mlnx_qos_text)
    node = roce_node(tmp / name, f"cat {quoted(tmp / f'{name}.qos')}")
    found = NcclNetwork().process(network_script(node, None))
    # the lab's address on the cluster interface (a capture of `ip -o addr` is not in these
    # trees): the interface the deploy finds the cluster address on
    found["interfaces"] = [{"name": "ens1f0", "addresses": [address], "bridge": False}]
    return found


def test_the_deploy_sets_the_tc_the_pfc_priority_takes_and_drift_names_the_odd_node(tmp_path):
    cluster = parse_cluster(SPEC)
    texts = {"n1": netarbiter(), "n2": netarbiter(), "n3": netarbiter(PFC3, PFC4)}
    networks = {
        n.name: live_network(tmp_path, n.name, texts[n.name], n.address) for n in cluster.nodes
    }
    derived = derive_cluster(cluster, networks)
    # the host's global traffic class 106 (DSCP 26 -> priority 3 by the default map) lands on
    # netarbiter's PFC priority: written where every NCCL process reads it
    assert derived["n1"].env["NCCL_IB_TC"] == "106" and derived["n1"].qos_problems == []
    assert nccl_part(derived["n1"]).nccl_conf.count("NCCL_IB_TC=106") == 1
    # node3's PFC is on priority 4: the TC misses it; named, and the env still written
    assert derived["n3"].qos_problems == [
        "mlx5_0:1 (ens1f0): the host's traffic_class (Global tclass) 106 (DSCP 26 -> priority 3) "
        "misses the PFC priority 4 of ens1f0 (mlnx_qos)"
    ]
    assert derived["n3"].problems == []
    observed = {name: qos_observed(nccl_part(d)) for name, d in derived.items()}
    assert observed["n1"] == {
        "RoCE QoS trust": "dscp",
        "RoCE PFC priority": "3",
        "RoCE traffic class": "106",
        "RoCE QoS problems": "none",
    }
    report = compare("roce", ["n1", "n2", "n3"], observed, {}, rules=RULES)
    found = {(f.node, f.property, f.kind) for f in report.findings}
    assert found == {
        ("n3", "RoCE PFC priority", "majority"),
        ("n3", "RoCE QoS problems", "health"),
    }


def test_a_spec_tc_is_kept_and_checked_against_the_hosts_pfc_priority(tmp_path):
    cluster = parse_cluster(SPEC + "nccl: {env: {NCCL_IB_TC: '160'}}\n")
    networks = {
        n.name: live_network(tmp_path, n.name, netarbiter(), n.address) for n in cluster.nodes
    }
    derived = derive_cluster(cluster, networks)
    assert derived["n2"].env["NCCL_IB_TC"] == "160"  # the spec's, never replaced
    assert any("160" in p and "priority 3" in p for p in derived["n2"].qos_problems)
