"""Values of the right shape that cannot be right (#43): refused before any host, each at its
line with what exists instead; what this project cannot know (a release newer than its table)
is accepted."""

from __future__ import annotations

import textwrap

import pytest

from trainfleet import SpecError, parse_spec
from trainfleet.releases import CUDA, TORCH

ONE = "nodes: [{name: a, address: 192.0.2.1}]\n"


def problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(textwrap.dedent(text), "bad.yml")
    return info.value.problems


@pytest.mark.parametrize(
    ("stack", "wanted"),
    [
        ("{cuda: '12.7'}", "stack.cuda: CUDA 12.7 was never released (12.6 is followed by 12.8)"),
        ("{cuda: '11.9.1'}", "stack.cuda: CUDA 11.9 was never released (11.8 is followed by 12.0)"),
        (
            "{cuda: '12.4', cudnn: '9.1'}",
            "stack.cudnn: '9.1' is not a valid version (expected the form '9.1.0.70')",
        ),
        (
            "{cuda: '12.4', driver: '550.54'}",
            "stack.driver: '550.54' is not a valid version (expected the form '550.54.15')",
        ),
        (
            "{torch: '2.4.9', torch_cuda: cpu}",
            "stack.torch: torch 2.4.9 was never released (torch 2.4 has 2.4.0, 2.4.1)",
        ),
    ],
)
def test_a_pin_that_names_no_release_is_refused_with_what_exists(stack, wanted):
    found = problems(f"stack: {stack}\n{ONE}")
    assert any(wanted in p for p in found), found


@pytest.mark.parametrize(
    "stack",
    [
        "{cuda: '12.8', driver: '570'}",
        "{cuda: '13.9'}",  # newer than the table: not this file's to refuse
        "{cuda: '12.4', cudnn: '9.1.0.70', driver: '550.54.15'}",
        "{torch: '2.4.1', torch_cuda: cu124}",
        "{torch: '2.13.0+cpu'}",  # a minor the table does not list: accepted
    ],
)
def test_real_and_newer_releases_are_accepted(stack):
    assert parse_spec(f"stack: {stack}\n{ONE}", "ok.yml")["stack"]


def test_the_tables_are_in_order_and_skip_what_nvidia_skipped():
    keys = [tuple(map(int, v.split("."))) for v in CUDA]
    assert keys == sorted(keys) and "12.7" not in CUDA and {"12.6", "12.8"} <= set(CUDA)
    assert all(list(p) == sorted(p) for p in TORCH.values())


def test_a_system_port_for_the_rendezvous_is_refused():
    found = problems(f"cluster: {{master_port: 22}}\n{ONE}")
    assert found == [
        "bad.yml:1: cluster.master_port: 22 is a system port (below 1024: 22 is sshd's); the "
        "rendezvous runs as the job's user on a port 1024-65535 (29500 by default); accepts: "
        "1024-65535"
    ]


def test_one_node_outside_the_subnet_every_other_node_shares_is_refused_unless_allowed():
    nodes = """\
    nodes:
      - {name: a, address: 192.0.2.11}
      - {name: b, address: 192.0.2.12}
      - {name: c, address: 192.0.12.13}
    """
    assert problems(nodes) == [
        "bad.yml:4: nodes[2].address: 192.0.12.13 is outside 192.0.2.0/24, where the other 2 "
        "nodes are: a typo? (a node that really is elsewhere: cluster.mixed_subnets: true)"
    ]
    allowed = textwrap.dedent(nodes) + "cluster: {mixed_subnets: true}\n"
    assert len(parse_spec(allowed, "ok.yml")["nodes"]) == 3
    # two nodes in each of two subnets is a layout, not a typo
    two_by_two = textwrap.dedent(nodes) + "  - {name: d, address: 192.0.12.14}\n"
    assert len(parse_spec(two_by_two, "ok.yml")["nodes"]) == 4
