"""Collective verdicts: the ranks' layout, why a rank failed, the rendezvous, versions,
and the isolation of a failing node or link. No host is touched here.
"""

from __future__ import annotations

from typing import Any

from checks.preflight_report import Problem
from trainfleet.compare import majority
from trainfleet.model import Cluster, Node
from trainfleet.text import printable


def collective_problems(
    cluster: Cluster, steps: dict[str, list[list[dict[str, Any]]]]
) -> list[Problem]:
    """Stage 3: every rank of every node (``steps[node][local rank]``) got through all_reduce
    (right sum) and all_gather (same versions). A node whose ranks all failed alike is named
    once with that cause; otherwise each failing rank is named by its local rank and GPU."""
    problems: list[Problem] = []
    names = [n.name for n in cluster.nodes]
    places = rank_places(cluster)
    causes = {node: [rank_failure(s) for s in ranks_of(cluster, steps, node)] for node in names}
    timeouts = [
        s
        for node in names
        for rank in steps.get(node, [])
        for s in rank
        if s.get("stage") == "rendezvous"
    ]
    every_rank = [rank for node in names for rank in ranks_of(cluster, steps, node)]
    if timeouts or rendezvous_tampered(every_rank):
        return _rendezvous_problems(cluster, steps, causes, timeouts)
    for node in names:
        problems += [
            Problem("collective", node, cause)
            for cause in node_causes(cluster, steps, node, causes[node])
        ]
    gathered = next(
        (
            s["versions"]
            for node in names
            for rank in steps.get(node, [])
            for s in rank
            if s.get("step") == "all_gather" and isinstance(s.get("versions"), list)
        ),
        None,
    )
    if gathered:
        problems += version_problems(
            [places.get(r, ("?", 0))[0] for r in range(len(gathered))], gathered
        )
    return problems


def ranks_of(
    cluster: Cluster, steps: dict[str, list[list[dict[str, Any]]]], node: str
) -> list[list[dict[str, Any]]]:
    """The node's ranks' steps, one list per local rank (a rank that printed nothing: [])."""
    mine = steps.get(node, [])
    return [mine[i] if i < len(mine) else [] for i in range(cluster.node(node).slots)]


def gpu_label(rank: list[dict[str, Any]], local: int) -> str:
    """The GPU a rank ran on, as it reported it (its CUDA_VISIBLE_DEVICES entry), else its index."""
    start = next((s for s in rank if s.get("step") == "start"), {})
    gpu = start.get("gpu")
    return printable(str(gpu), 40) if gpu is not None else str(local)


def _who(
    cluster: Cluster, steps: dict[str, list[list[dict[str, Any]]]], node: str, local: int
) -> str:
    """ "local rank 3 (GPU 3): " on a node of several ranks, nothing on a node of one."""
    if cluster.node(node).slots == 1:
        return ""
    return f"local rank {local} (GPU {gpu_label(ranks_of(cluster, steps, node)[local], local)}): "


def node_causes(
    cluster: Cluster,
    steps: dict[str, list[list[dict[str, Any]]]],
    node: str,
    causes: list[str | None],
) -> list[str]:
    """One cause for the node when every rank failed alike (no venv, no torch), else one per
    failing rank."""
    if causes and all(causes) and len(set(causes)) == 1:
        return [str(causes[0])]
    return [
        f"{_who(cluster, steps, node, local)}{cause}" for local, cause in enumerate(causes) if cause
    ]


def _rendezvous_problems(
    cluster: Cluster,
    steps: dict[str, list[list[dict[str, Any]]]],
    causes: dict[str, list[str | None]],
    timeouts: list[dict[str, Any]],
) -> list[Problem]:
    """The ranks the job's store never saw, by node, from the views of the ranks that reached it
    (each rank's timeout step); a rank that failed on its own (no venv, no torch) says why
    instead. Fails closed: a view the ranks' processes cannot have produced, or a timeout with
    no rank missing, fails every node alike (the rendezvous decided nothing about one node)."""
    places = rank_places(cluster)
    where = f"the rendezvous at {cluster.master.name}:{cluster.master_port}"
    if why := rendezvous_contradiction(cluster, steps, timeouts):
        cause = f"{where} {why}: not one node's verdict, every node is named alike"
        return [Problem("collective", node.name, cause) for node in cluster.nodes]
    views = [t for t in timeouts if "missing" in t]
    if not views:  # no rank reached the store: its own server's failure, or nobody's alone
        master = cluster.master.name
        own = [c for c in causes.get(master, []) if c and "timed out" not in c]
        if own:
            return [
                Problem("collective", master, cause)
                for cause in node_causes(cluster, steps, master, causes[master])
            ]
        cause = f"no rank reached the store of {where} in time"
        return [Problem("collective", node.name, cause) for node in cluster.nodes]
    seen = {r for view in views for r in _ints(view.get("joined"))}
    joined_nodes = sorted(
        {places[r][0] for r in seen if r in places}, key=lambda n: cluster.node(n).rank
    )
    missing: dict[str, list[int]] = {}
    for r in sorted({r for view in views for r in _ints(view.get("missing"))} - seen):
        missing.setdefault(places[r][0], []).append(places[r][1])
    problems = []
    where = f"{where} (joined: {', '.join(joined_nodes) or 'none'})"
    for node, locals_ in missing.items():
        slots = cluster.node(node).slots
        own = [
            causes[node][i] if i in locals_ and "timed out" not in str(causes[node][i]) else None
            for i in range(slots)
        ]
        problems += [
            Problem("collective", node, cause) for cause in node_causes(cluster, steps, node, own)
        ]
        silent = [i for i in locals_ if own[i] is None]
        if silent and len(silent) == slots:
            problems.append(Problem("collective", node, f"never joined {where}"))
        elif silent:
            ranks = ", ".join(map(str, silent))
            problems.append(
                Problem("collective", node, f"local ranks {ranks} never joined {where}")
            )
    return problems


def rendezvous_contradiction(
    cluster: Cluster,
    steps: dict[str, list[list[dict[str, Any]]]],
    timeouts: list[dict[str, Any]],
) -> str | None:
    """What in the ranks' views of the store the job's processes cannot have written (None:
    nothing): each rank sets ``joined/<rank>`` and then adds 1 to ``joined``, so a view splits
    the world into joined and missing ranks, its counter lies between 0 and the ranks joined,
    and a rank that never started (no venv, no torch) or never reached the store is not among
    the joined; a timeout needs a missing rank; a server that could not prove the run's secret
    is not the job's; a failed rendezvous whose store refused connections decided nothing
    about any one node."""
    places = rank_places(cluster)
    world = len(places)
    refused = max(
        (store_refused(rank) or 0 for ranks in steps.values() for rank in ranks), default=0
    )
    if refused:
        return (
            f"failed while its store refused {refused} connection(s) that were not the job's "
            "ranks' (a flood can make any chosen rank late)"
        )
    if any(t.get("impostor") for t in timeouts):
        return "was answered by a process that does not hold the run's secret"
    views = [t for t in timeouts if "missing" in t or "joined" in t]
    for view in views:
        joined, missing = view.get("joined"), view.get("missing")
        count = view.get("count", len(_ints(joined)))
        if (
            not isinstance(joined, list)
            or not isinstance(missing, list)
            or _ints(joined) != joined
            or _ints(missing) != missing
            or sorted(joined + missing) != list(range(world))
        ):
            return "reported ranks that are not the job's, or not each once"
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= len(joined):
            return f"counted {printable(str(count), 20)} ranks joined, not 0 to {len(joined)}"
        if not missing:
            return "timed out though every rank had joined it"
    seen = {r for view in views for r in view["joined"]}
    for r in sorted(seen):
        node, local = places[r]
        rank = ranks_of(cluster, steps, node)[local]
        if any(
            (s.get("step") == "error" and s.get("stage") in BEFORE_THE_NETWORK)
            or (s.get("stage") == "rendezvous" and s.get("reached") is False)
            for s in rank
        ):
            return f"lists rank {r} of {node} as joined, which never reached it"
    return None


def store_refused(steps: list[dict[str, Any]]) -> int | None:
    """How many connections a job's store refused (connections no rank of the job makes: past
    its pending limit, a failed or unfinished handshake, anything invalid), from one rank's
    steps of that job: its rank 0 prints ``{"step": "store", "job": J, "refused": N}`` just
    before the job's last step, once its store ran. None: no such step (not rank 0, its store
    never ran, or it was cut off first). A count that is not a whole number >= 0 (never
    printed by the ranks) counts as 1: fails closed."""
    counts = [s.get("refused") for s in steps if s.get("step") == "store"]
    if not counts:
        return None
    return max(
        c if isinstance(c, int) and not isinstance(c, bool) and c >= 0 else 1 for c in counts
    )


RENDEZVOUS_STAGES = ("rendezvous", "store")


def rendezvous_failed(ranks: list[list[dict[str, Any]]]) -> bool:
    """Whether a job (each of its ranks' steps of that job) failed at its rendezvous: a rank
    timed out or failed there, or one that started stopped before it joined for no cause of
    its own (not a failure before the network)."""
    for rank in ranks:
        if any(s.get("stage") in RENDEZVOUS_STAGES for s in rank):
            return True
        said = {s.get("step") for s in rank}
        own = any(s.get("step") == "error" and s.get("stage") in BEFORE_THE_NETWORK for s in rank)
        if "start" in said and "joined" not in said and not own:
            return True
    return False


def rendezvous_tampered(ranks: list[list[dict[str, Any]]]) -> bool:
    """Whether a job (each of its ranks' steps of that job, in any order) failed at its
    rendezvous while its store refused connections: then which rank was late says nothing about
    its node (a flood timed by a user can make any chosen rank late), and every node of the
    job is named alike. A job that met and then failed on its own (a sum, a version) is not."""
    refused = max((store_refused(rank) or 0 for rank in ranks), default=0)
    return refused > 0 and rendezvous_failed(ranks)


def _ints(values: Any) -> list[int]:
    return (
        [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
        if isinstance(values, list)
        else []
    )


BEFORE_THE_NETWORK = ("python", "import", "secret")  # a rank's failures before it reached any peer


def failed_before_the_network(steps: dict[str, list[list[dict[str, Any]]]]) -> set[str]:
    """Nodes every rank of which failed before touching the network (no venv, torch not
    importable): their own cause is named, and no pair test can say more about a link."""
    return {
        node
        for node, ranks in steps.items()
        if ranks
        and all(
            any(s.get("step") == "error" and s.get("stage") in BEFORE_THE_NETWORK for s in rank)
            for rank in ranks
        )
    }


TIMEOUT_EXITS = (124, 137)  # timeout(1)'s status, and SIGKILL's after its grace period


def rank_owners(cluster: Cluster) -> dict[int, str]:
    """Global rank -> node, as every launcher numbers them: the nodes in spec (hostfile)
    order, each with its slots."""
    return {rank: node for rank, (node, _) in rank_places(cluster).items()}


def rank_layout(nodes: list[Node]) -> dict[str, tuple[int, int]]:
    """Node -> (its first global rank, its number of ranks) for a job over ``nodes`` in this
    order: one rank per GPU (one on a CPU node), numbered as launchers number them."""
    layout: dict[str, tuple[int, int]] = {}
    first = 0
    for node in nodes:
        layout[node.name] = (first, node.slots)
        first += node.slots
    return layout


def rank_places(cluster: Cluster) -> dict[int, tuple[str, int]]:
    """Global rank -> (node, local rank) over the whole cluster."""
    return {
        first + local: (node, local)
        for node, (first, count) in rank_layout(cluster.nodes).items()
        for local in range(count)
    }


def rank_failure(steps: list[dict[str, Any]]) -> str | None:
    """Why one rank did not finish, in the words of what failed (None: it finished)."""
    progress = [s for s in steps if s.get("step") not in ("exit", "stderr", "nccl")]
    last = progress[-1] if progress else {"step": "no output"}
    summed = next(
        (s for s in steps if s.get("step") == "all_reduce" and s.get("ok") is not True), None
    )
    if summed:
        return f"all_reduce gave {summed.get('got')}, expected {summed.get('expected')}"
    if last.get("step") == "done":
        return None
    if last.get("step") == "error":
        return f"{last.get('stage')} failed: {printable(str(last.get('error')))}"
    code = next((s.get("code") for s in steps if s.get("step") == "exit"), None)
    stderr = [s.get("text", "") for s in steps if s.get("step") == "stderr"]
    if code is None or code in TIMEOUT_EXITS:
        return f"stopped after {last.get('step')!r} (timed out)"
    said = f": {stderr[-1]}" if stderr else " and wrote nothing to stderr"
    return f"python exited with status {code} after {last.get('step')!r}{said}"


def version_problems(owners: list[str], versions: list[dict[str, Any]]) -> list[Problem]:
    """The odd node out of the versions every rank reported, by drift's majority vote
    (trainfleet.compare.majority: a tie names every node, with the count of each value);
    ``owners[rank]`` is the rank's node. A node is named once per differing value, however
    many ranks it runs."""
    problems: list[Problem] = []
    for key in ("torch", "cuda", "nccl"):
        values = {
            str(rank): str(v.get(key) if isinstance(v, dict) else None)
            for rank, (_, v) in enumerate(zip(owners, versions, strict=False))
        }
        for finding in majority(key, values):
            said = printable(finding.observed)
            cause = (
                f"{key} {said}: the ranks have no majority ({printable(finding.expected or '')})"
                if finding.kind == "tie"
                else f"{key} {said} differs from the other ranks' "
                f"{printable(finding.expected or '')}"
            )
            problem = Problem("collective", owners[int(finding.node)], cause)
            if problem not in problems:
                problems.append(problem)
    return problems


def second_pass(cluster: Cluster, first: dict[str, bool]) -> list[tuple[str, str]]:
    """The isolation's second pass, from its first (the master with each node: ``{node:
    passed}``): each node that failed with the master paired with a node that passed (in turn),
    so a bad link to the master is told from a bad node; where every pair with the master
    failed, the first other node with each of the rest (no pass: the master is at fault)."""
    failing = [node for node, ok in first.items() if not ok]
    good = [node for node, ok in first.items() if ok]
    if not failing:
        return []
    if good:
        return [(good[i % len(good)], node) for i, node in enumerate(failing)]
    return [(failing[0], node) for node in failing[1:]]


def isolate(
    cluster: Cluster,
    first: dict[str, bool],
    second: dict[str, tuple[str, bool]] | None = None,
) -> list[Problem]:
    """Stage 5's verdicts: ``first``, the master with each node (``{node: passed}``);
    ``second``, the second pass (``{node: (its partner, passed)}``). A node that fails with the
    master and with a node known good is at fault; one that passes with the known good node
    has a bad link to the master (named on it: it cannot train with the master). Every pair
    with the master failing while pairs without it pass: the master is at fault; pairs failing
    without it too: the fault is not one node's (every node is named alike). Without a second
    pass the first decides alone."""
    master = cluster.master.name
    second = second or {}
    failing = [node for node, ok in first.items() if not ok]
    if failing and len(failing) == len(first) and len(first) > 1:
        passed = [node for node, (_, ok) in second.items() if ok]
        if second and not passed:
            cause = "every 2-rank pair fails, with the master and without it: not one node's fault"
            return [Problem("isolation", node.name, cause) for node in cluster.nodes]
        partner = next(iter(second.values()))[0] if second else None
        problems = [
            Problem(
                "isolation",
                master,
                "every pair with the master fails: the master is at fault"
                + (f" ({partner} passes with {', '.join(passed)})" if passed else ""),
            )
        ]
        return problems + [
            Problem("isolation", node, f"fails with the master and with {partner}")
            for node, (_, ok) in second.items()
            if not ok
        ]
    problems = []
    for node in failing:
        partner, ok = second.get(node, (None, None))
        if partner is None:
            cause = (
                f"a 2-rank collective between {master} and {node} fails: "
                f"the link to {node} (or {node} itself) is at fault"
            )
        elif ok:
            cause = (
                f"a 2-rank collective between {master} and {node} fails, between {partner} and "
                f"{node} passes: the link between {master} and {node} is at fault"
            )
        else:
            cause = (
                f"2-rank collectives between {node} and {master}, and between {node} and "
                f"{partner} (which passes with {master}) fail: {node} is at fault"
            )
        problems.append(Problem("isolation", node, cause))
    return problems


SOCKET_INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def missing_interfaces(
    seen: dict[str, dict[str, Any]], networks: dict[str, Any] | None, backend: str
) -> dict[str, str]:
    """The nodes whose ranks would be told to use a network interface the node does not have
    (``GLOO_SOCKET_IFNAME``, and with NCCL ``NCCL_SOCKET_IFNAME``, in the non-login environment
    hygiene read, against the interfaces the node's network fact lists), each with why: their
    ranks fail at once while every other rank waits out the collective's bound, so the
    collective cannot succeed and is not run. Gloo opens every interface it lists; NCCL's
    ``=name`` is exact, ``^...`` (exclusions) is not judged, a bare name is a prefix. A node
    whose interfaces were not read is not judged here."""
    missing = {}
    for node, data in sorted(seen.items()):
        have = [i.get("name", "") for i in ((networks or {}).get(node) or {}).get("interfaces", [])]
        if not have:
            continue
        for variable in SOCKET_INTERFACE_VARIABLES[: 2 if backend == "nccl" else 1]:
            value = str((data.get("env") or {}).get(variable) or "")
            if not value or value.startswith("^"):
                continue
            wanted = [w for w in value.lstrip("=").split(",") if w]
            if variable == "GLOO_SOCKET_IFNAME":  # gloo opens every one it lists
                found = all(w in have for w in wanted)
            else:  # NCCL uses those that match: one is enough
                exact = value.startswith("=")
                found = any(n == w if exact else n.startswith(w) for w in wanted for n in have)
            if not found:
                listed = ", ".join(printable(n, 20) for n in have)
                missing[node] = (
                    f"{variable}={printable(value, 60)} names an interface the node does not "
                    f"have (it has {listed}): its ranks cannot start, the collective is not run"
                )
                break
    return missing
