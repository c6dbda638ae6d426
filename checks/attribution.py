"""Who is at fault, from the pattern of a stage's pair results: never from who reported it.

Plain data in (the nodes, the pairs a stage tested, those that failed, each a directed
``(source, target)``: "source could not reach / log in to / keep up with target"), plain data
out. Every stage that tests nodes in pairs (reachability, the SSH mesh, the bandwidth stage)
judges its failures here, so one cut-off node never takes its healthy peers down with it.

The rules, in order:
- a node that fails with more than half of the peers it was tested with (and with at least two)
  is at fault: "no peer reaches it", "it reaches no peer", or the peers it fails with;
- of what is left, a node in two or more failing pairs whose other ends fail nowhere else (the
  centre of a star) is at fault;
- every remaining failing pair that shares no node with another is a link: both ends named (a
  single pair cannot tell the node from the link; a second pass with other partners can);
- anything else, or more faults than a minority of the nodes can explain (a split into halves,
  every pair failing), is explained by no node or link: every node is left out, and the verdict
  says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from checks.preflight_report import Problem

Pair = tuple[str, str]  # (source, target): directed, as a stage tested it


@dataclass(frozen=True)
class Attribution:
    """``nodes``: each node at fault -> how its failures look; ``links``: the failing pairs that
    are links (lower-ranked node first), both ends named; ``unexplained``: no node or link
    explains the pattern (every node is left out); ``failed``: the failing pairs judged."""

    nodes: dict[str, str] = field(default_factory=dict)
    links: list[Pair] = field(default_factory=list)
    unexplained: bool = False
    failed: list[Pair] = field(default_factory=list)

    def left_out(self, everyone: list[str]) -> list[str]:
        """The nodes this verdict leaves out, in rank order."""
        if self.unexplained:
            return list(everyone)
        named = set(self.nodes) | {node for link in self.links for node in link}
        return [node for node in everyone if node in named]


def attribute(nodes: list[str], tested: Iterable[Pair], failed: Iterable[Pair]) -> Attribution:
    """The verdict over ``nodes`` (rank order) from the ``tested`` pairs and the ``failed`` ones
    (a subset of them; a node's pair with itself is its own business, not judged here)."""
    rank = {node: i for i, node in enumerate(nodes)}
    tested_set = {p for p in tested if p[0] != p[1]}
    failed_set = {p for p in failed if p[0] != p[1]} & tested_set
    failed_list = sorted(failed_set, key=lambda p: (rank.get(p[0], 0), rank.get(p[1], 0)))
    if not failed_set:
        return Attribution()
    peers = _undirected(tested_set)
    failing = _undirected(failed_set)
    culprits = {
        node: _how(node, tested_set, failed_set, failing[node])
        for node in nodes
        if len(peers.get(node, ())) >= 2 and 2 * len(failing.get(node, ())) > len(peers[node])
    }
    left = {frozenset(p) for p in failed_set if p[0] not in culprits and p[1] not in culprits}
    culprits |= _stars(left, tested_set, failed_set)
    links = sorted(
        (tuple(sorted(pair, key=rank.__getitem__)) for pair in left if not pair & set(culprits)),
        key=lambda p: (rank[p[0]], rank[p[1]]),
    )
    ends = [node for link in links for node in link]
    faults = len(culprits) + len(links)
    if len(ends) != len(set(ends)) or faults > max(1, (len(nodes) - 1) // 2):
        return Attribution(unexplained=True, failed=failed_list)
    return Attribution(
        nodes={node: culprits[node] for node in nodes if node in culprits},
        links=[(a, b) for a, b in links],
        failed=failed_list,
    )


def _undirected(pairs: set[Pair]) -> dict[str, set[str]]:
    peers: dict[str, set[str]] = {}
    for a, b in pairs:
        peers.setdefault(a, set()).add(b)
        peers.setdefault(b, set()).add(a)
    return peers


def _how(node: str, tested: set[Pair], failed: set[Pair], failing: set[str]) -> str:
    """How a node's failures look: every peer fails to reach it, it reaches none, or which."""
    inbound = [p for p in tested if p[1] == node]
    outbound = [p for p in tested if p[0] == node]
    if inbound and all(p in failed for p in inbound):
        both = outbound and all(p in failed for p in outbound)
        return "fails with every peer" if both else "no peer reaches it"
    if outbound and all(p in failed for p in outbound):
        return "it reaches no peer"
    return f"fails with {', '.join(sorted(failing, key=_natural))}"


def _natural(name: str) -> tuple[str, int]:
    """node2 before node10: a name's leading text, then its trailing number."""
    text = name.rstrip("0123456789")
    return text, int(name[len(text) :] or 0)


def _stars(left: set[frozenset[str]], tested: set[Pair], failed: set[Pair]) -> dict[str, str]:
    """Nodes in two or more of the ``left`` failing pairs whose other ends fail in no other:
    the centre is the one at fault."""
    count: dict[str, int] = {}
    for pair in left:
        for node in pair:
            count[node] = count.get(node, 0) + 1
    centres = {}
    for node, n in count.items():
        others = [next(iter(pair - {node})) for pair in left if node in pair]
        if n >= 2 and all(count[other] == 1 for other in others):
            centres[node] = _how(node, tested, failed, set(others))
    return centres


def pattern_problems(
    stage: str,
    nodes: list[str],
    tested: Iterable[Pair],
    failed: Iterable[Pair],
    why: Callable[[str, str], str],
) -> list[Problem]:
    """A pair stage's failures as problems, by their pattern: each node at fault named alone with
    how (``why(source, target)`` words each failing pair), each link on both its ends, and a
    pattern no node or link explains on every node with the same cause."""
    failed = list(failed)
    verdict = attribute(nodes, tested, failed)
    if verdict.unexplained:
        cause = (
            f"{len(verdict.failed)} failing pairs that no single node or link explains "
            f"({few([why(*p) for p in verdict.failed])}): every node is left out"
        )
        return [Problem(stage, node, cause) for node in nodes]
    problems = [
        Problem(stage, node, f"{how}: {few([why(*p) for p in verdict.failed if node in p])}")
        for node, how in verdict.nodes.items()
    ]
    for a, b in verdict.links:
        words = few([why(*p) for p in verdict.failed if set(p) == {a, b}])
        cause = f"the link {a}-{b} fails ({words}): both ends named, neither told at fault"
        problems += [Problem(stage, a, cause), Problem(stage, b, cause)]
    return problems


def few(items: list[str], shown: int = 3) -> str:
    """At most ``shown`` of ``items``, and how many more: a cause reads at 64 nodes."""
    more = f"; and {len(items) - shown} more" if len(items) > shown else ""
    return "; ".join(items[:shown]) + more
