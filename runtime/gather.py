"""This run's facts: gathered once per run for every node (one remote command each), held on
pyinfra's ``State``, and the run's plan built from them, once, for every node's deploy.

Operations ask ``fact()``; deploys and checks ask ``deploy_plan()`` / ``gather_fact()``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from gevent.event import AsyncResult
from pyinfra import host as current_host
from pyinfra import logger
from pyinfra.api import FactBase, State
from pyinfra.api.facts import get_fact
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_host, ctx_state

from facts.sudo_facts import sudo_form, sudo_probe_command, sudo_refusal
from runtime import inventory
from runtime.bundle import DeployState, plan_inputs
from runtime.fanout import fan_out
from runtime.faults import name_step_faults
from trainfleet import stamps
from trainfleet.key_preparation import prepare_keys
from trainfleet.keystore import KeyStore
from trainfleet.model import Cluster, Node
from trainfleet.plan import cluster_blocks, plan_cluster
from trainfleet.plan_types import ClusterPlan

T = TypeVar("T")


class RunFacts:
    """What one pyinfra run has gathered, held on its ``State`` (gone with it, never shared
    between runs): results computed once per run, the one-command fact reads per host, and
    facts an operation lends to the operations it composes."""

    def __init__(self) -> None:
        self.once: dict[str, AsyncResult] = {}
        self.read: dict[str, dict[tuple[Any, ...], Any]] = {}  # host name -> {fact key: value}
        self.lent: dict[str, dict[tuple[Any, ...], Any]] = {}
        self.sudo: dict[
            str, str | None
        ] = {}  # host name -> None (proved) or why its sudo was refused
        self.failed_before_plan: set[Any] = set()  # hosts already failed when the plan was made
        self.whole_cluster = (
            False  # every inventory host was in the run, none failed, when the plan was made
        )
        # hosts failed when the first step in a mesh user's own home began (mesh_users_begin)
        self.failed_before_users: set[Any] | None = None
        # host name -> {mesh user: the step in that user's home that failed there this run}
        self.home_failures: dict[str, dict[str, str]] = {}


def run_facts(state: State) -> RunFacts:
    facts = getattr(state, "trainfleet_facts", None)
    if facts is None:
        facts = state.trainfleet_facts = RunFacts()
    return facts


def gather_fact(
    state: State,
    fact: type,
    per_node: Callable[[str], dict[str, Any]] | None = None,
    nodes: Collection[str] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """``{node name: fact}`` from every active host, one remote command each, in parallel.

    + per_node: the arguments that differ between nodes, ``node name -> kwargs`` (drift's
      mesh probe: each node its own peers); such a read is never answered from ``read_once``
    + nodes: only these nodes (drift's second look at the few that differ), never from ``read_once``

    pyinfra's own ``get_facts`` spawns into the state's pool, which deploy code already
    occupies while it runs (it deadlocks there); a pool of our own does not.
    """
    hosts = [
        h
        for h in state.inventory.get_active_hosts()
        if nodes is None or h.data.get("trainfleet_node", h.name) in nodes
    ]
    key = _key(fact, kwargs)
    stores = [run_facts(state).read.get(h.name) for h in hosts]
    cached = all(store is not None and key in store for store in stores)
    if hosts and per_node is None and nodes is None and cached:
        return {
            h.data.get("trainfleet_node", h.name): store[key]
            for h, store in zip(hosts, stores, strict=False)
        }

    hosts = [h for h in hosts if h not in prove_sudo(state, hosts)]

    def one(host):
        mine = (
            {**kwargs, **per_node(host.data.get("trainfleet_node", host.name))}
            if per_node
            else kwargs
        )
        with ctx_host.use(host):
            return get_fact(state, host, fact, kwargs=mine)

    results = fan_out(one, hosts, state.config.PARALLEL)
    return {
        host.data.get("trainfleet_node", host.name): result
        for host, result in zip(hosts, results, strict=False)
    }


def prove_sudo(state: State, hosts: list[Any]) -> set[Any]:
    """The hosts whose sudo login (``ssh.become: sudo``) cannot act as root without a
    password, proved once per run before their first fact, all at once. Each is failed with
    one clear error and taken out of the run, its sudo switched off so nothing later prompts
    for a password; a run left with no host ends with pyinfra's "No hosts remaining!"."""
    proofs = run_facts(state).sudo
    unproved = [h for h in hosts if h.name not in proofs]

    def probe(host: Any) -> tuple[str, str | None]:
        if not host.data.get("_sudo"):
            return host.name, None
        _, output = host.run_shell_command(sudo_probe_command(sudo_form(state, host)), _timeout=30)
        return host.name, sudo_refusal(output.stdout_lines, str(host.data.get("ssh_user")))

    if unproved:
        proofs.update(fan_out(probe, unproved))
    refused = {h for h in hosts if proofs.get(h.name)}
    for host in refused:
        logger.error(f"{host.print_prefix}trainfleet: {proofs[host.name]}")
        host.data._sudo = False
    state.fail_hosts(refused)
    return refused


def this_node() -> tuple[Cluster, Node]:
    """The cluster and the node this deploy runs for (``runtime.inventory.this_node``),
    once every sudo login of the run has proved it acts as root without a password: every
    deploy file starts here, before any fact or stage could make pyinfra prompt for one.
    A node that fails a step from here on is named with what happened (runtime/faults.py)."""
    once_per_run("step faults", name_step_faults)
    once_per_run("home faults", lambda state: state.add_callback_handler(HomeFaults()))
    once_per_run(
        "sudo proved", lambda state: prove_sudo(state, list(state.inventory.get_active_hosts()))
    )
    return inventory.this_node()


def refused_sudo(state: State) -> dict[str, str]:
    """{node name: why} for the nodes whose sudo login was refused this run."""
    return {
        h.data.get("trainfleet_node", h.name): why
        for h in state.inventory
        if (why := run_facts(state).sudo.get(h.name))
    }


def once_per_run(name: str, compute: Callable[[State], T]) -> T:
    """``compute(state)`` once per pyinfra run, however many hosts' deploys ask for it.

    pyinfra runs each host's deploy code in its own greenlet; while the first one gathers
    facts, the others wait here for its result instead of gathering again (N x N execs).
    """
    state = ctx_state.get()
    once = run_facts(state).once
    if name in once:
        return once[name].get()
    result: AsyncResult = AsyncResult()
    once[name] = result
    try:
        value = compute(state)
    except BaseException as exc:
        result.set_exception(exc)
        raise
    result.set(value)
    return value


def _key(fact: type, kwargs: dict[str, Any]) -> tuple[Any, ...]:
    return (
        fact,
        tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in kwargs.items())),
    )


def read_once(bundle: type[FactBase], **kwargs: Any) -> dict[str, Any]:
    """Read every fact a deploy's operations need, for every host, in ONE remote command per
    host, once per run (a FactBundle); ``fact()`` and ``gather_fact()`` then answer from it.
    Returns ``{node name: sections}`` (a node that could not be read: empty).

    pyinfra has no fact cache: without this, each operation's fact is its own round trip.
    """

    def compute(state: State) -> dict[str, Any]:
        parts = bundle().parts(**kwargs)
        hosts = {
            h.data.get("trainfleet_node", h.name): h for h in state.inventory.get_active_hosts()
        }
        gathered = gather_fact(state, bundle, **kwargs)
        for node, sections in gathered.items():
            if sections:  # a host that could not be read asks again, and fails, in its operations
                run_facts(state).read[hosts[node].name] = {
                    _key(cls, fact_kwargs): sections[name]
                    for name, (cls, fact_kwargs) in parts.items()
                }
        return gathered

    return once_per_run(f"read once: {bundle.__name__}", compute)


def deploy_plan(cluster: Cluster) -> ClusterPlan:
    """This run's plan of every node, from the facts the deploy reads (``DeployState``, one
    remote command per node) and the key store, built once per run however many hosts deploy;
    its notes are logged once. The key store is brought up to date first (``prepare_keys``:
    the run's one writer of it; not where the spec leaves the mesh unmanaged), then the plan
    reads its snapshot."""

    def compute(state: State) -> ClusterPlan:
        run_facts(state).failed_before_plan = set(state.failed_hosts)
        run_facts(state).whole_cluster = not state.failed_hosts and set(state.inventory) <= set(
            state.active_hosts
        )
        read = read_once(DeployState, users=cluster.mesh_users, blocks=cluster_blocks(cluster))
        gathered = plan_inputs(read)
        store = KeyStore(cluster.name)
        # An unmanaged mesh (manage.ssh_mesh: false) makes no key or CA: the store read only.
        keys = (
            prepare_keys(store, cluster, gathered)
            if cluster.manages("ssh_mesh")
            else store.snapshot(cluster.mesh_users, [n.name for n in cluster.nodes])
        )
        built = plan_cluster(cluster, gathered, keys, preflight_exclusions(cluster))
        for note in built.notes:
            logger.warning(note)
        return built

    return once_per_run("plan", compute)


def preflight_exclusions(cluster: Cluster) -> dict[str, list[str]]:
    """The nodes the last preflight of each failed, with its causes (the controller's stamps):
    the deploy and drift leave them out of the healthy subset's launch files."""
    return stamps.exclusions(stamps.load(cluster.name), [n.name for n in cluster.nodes])


def no_host_failed() -> bool:
    """For ``_if`` (evaluated as the operation runs): no node has failed since this run's plan
    was made, so a cluster-wide step before this one holds on every node it planned for (a
    node unreachable from the start was never part of it)."""
    state = ctx_state.get()
    return set(state.failed_hosts) <= run_facts(state).failed_before_plan


def mesh_users_begin() -> bool:
    """For ``_if`` of the first step in a (non-root) mesh user's home: notes which nodes had
    failed before any of them (the root-owned mesh steps: known_hosts, sshd, root's own).
    pyinfra runs each step on every node before the next, so that is every failure a user
    could not cause (a step in a user's home fails no node: ``HomeIntact``). Always true."""
    facts = run_facts(ctx_state.get())
    if facts.failed_before_users is None:
        facts.failed_before_users = set(ctx_state.get().failed_hosts)
    return True


def no_root_step_failed() -> bool:
    """For ``_if`` of a mesh user's steps and the KRL: no node failed a root-owned mesh step
    before the users' homes this run. A failure in a mesh user's home (which the user can cause,
    every run) is none of those: it costs that user's later steps on its own node only, the
    other nodes move and drop old trust without it, and its node's KRL is still written."""
    state = ctx_state.get()
    facts = run_facts(state)
    before = facts.failed_before_users
    return (set(state.failed_hosts) if before is None else before) <= facts.failed_before_plan


def a_root_step_failed() -> bool:
    """For ``_if``: ``no_root_step_failed``'s opposite."""
    return not no_root_step_failed()


def whole_cluster_root_steps_healthy() -> bool:
    """For ``_if``: this run reached every node (no ``--limit``, none down) and no node failed a
    root-owned mesh step: a mesh user's old trust may go on every node that got this far."""
    return run_facts(ctx_state.get()).whole_cluster and no_root_step_failed()


class HomeIntact:
    """For ``_if`` of a step in a (non-root) mesh user's own home, run with ``_ignore_errors``:
    no earlier step in that home failed on this node this run. The user can make such a step
    fail every run (``chmod 500 ~/.ssh``): it costs that user's later steps on that node, never
    the node's root-owned steps (its KRL) nor the other users' steps; ``a_mesh_user_step_failed``
    fails the node once those ran."""

    def __init__(self, user: str) -> None:
        self.user = user

    def __call__(self) -> bool:
        return self.user not in home_failures()


def note_home_failure(state: Any, host_name: str, step: str, gates: Any) -> bool:
    """Records a failed step that ran with ``_ignore_errors`` in a mesh user's home (its gates
    hold a ``HomeIntact``); True if it was one."""
    gates = gates if isinstance(gates, list) else [gates]
    users = [gate.user for gate in gates if isinstance(gate, HomeIntact)]
    for user in users:
        run_facts(state).home_failures.setdefault(host_name, {}).setdefault(user, step)
    return bool(users)


class HomeFaults(BaseStateCallback):
    """Notes each step in a mesh user's home that failed (pyinfra reports an ignored error to
    ``operation_host_error`` too)."""

    def operation_host_error(
        self, state: State, host: Any, op_hash: Any, retry_count: int = 0, max_retries: int = 0
    ) -> None:
        arguments = state.get_op_data_for_host(host, op_hash).global_arguments
        if arguments.get("_ignore_errors"):
            step = ", ".join(state.get_op_meta(op_hash).names) or "an operation"
            note_home_failure(state, host.name, step, arguments.get("_if"))


def home_failures() -> dict[str, str]:
    """This node's failed steps in mesh users' homes this run: ``{user: step}``."""
    return run_facts(ctx_state.get()).home_failures.get(current_host.name, {})


def a_mesh_user_step_failed() -> bool:
    """For ``_if`` of the mesh's last step: a step in a mesh user's home failed on this node."""
    return bool(home_failures())


def whole_cluster_healthy() -> bool:
    """For ``_if``: this run reached every node of the inventory (no ``--limit``, none down)
    and none has failed since its plan was made: a step every node took holds cluster-wide."""
    state = ctx_state.get()
    facts = run_facts(state)
    return facts.whole_cluster and not state.failed_hosts


def fact(cls: type[FactBase], **kwargs: Any) -> Any:
    """The current host's fact: lent by a composing operation, or from this run's
    ``read_once``, else read now (a deploy that did not read once, fixture tests).

    A host whose facts ``read_once`` gathered asking for one it did not gather is a bug (the
    bundle's list and the operations disagree): it raises instead of costing a round trip.
    """
    facts = run_facts(ctx_state.get())
    key = _key(cls, kwargs)
    for store in (facts.lent.get(current_host.name), facts.read.get(current_host.name)):
        if store is not None and key in store:
            return store[key]
    if current_host.name in facts.read:
        raise RuntimeError(
            f"{cls.__name__}({kwargs}) was not gathered by read_once: add it to the bundle's parts"
        )
    return current_host.get_fact(cls, **kwargs)


@contextmanager
def lent(cls: type[FactBase], value: Any, **kwargs: Any) -> Iterator[None]:
    """While composing operations: ``fact(cls, **kwargs)`` answers ``value`` for this host."""
    store = run_facts(ctx_state.get()).lent.setdefault(current_host.name, {})
    key = _key(cls, kwargs)
    store[key] = value
    try:
        yield
    finally:
        store.pop(key, None)
