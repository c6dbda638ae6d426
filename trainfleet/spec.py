"""Load and validate a cluster spec (YAML) before any host is touched.

Every problem becomes one line ``FILE:LINE: KEY: what is wrong``; all of them are
reported at once, and callers exit with status 2 (see ``SpecError``). A value the key's grammar
refuses also says what the key accepts, in the words of the reference (``Key.accepts``).
"""

from __future__ import annotations

import difflib
import ipaddress
import re
import reprlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainfleet import node_sets
from trainfleet.capabilities.stack import STACK
from trainfleet.driver_pins import driver_for_cuda_problem, variant_cuda
from trainfleet.grammar import (
    Check,
    Key,
    Section,
    address_problem,
    cluster_name_problem,
    keys_grammar,
    normalized_dist,
    preflight_python_problem,
    type_name,
)
from trainfleet.model import Cluster
from trainfleet.schema import CLUSTER, NODE, SPEC

EXIT_BAD_SPEC = 2
DEFAULT_SOURCE = "<spec>"  # spec text that comes from no file

PathT = tuple[str | int, ...]

# What YAML 1.1 (PyYAML's safe_load) reads as a boolean when unquoted, in any of three cases.
YAML_BOOLEANS = "on, off, yes, no, true and false"
_BOOL_TAG = "tag:yaml.org,2002:bool"

NODES_GRAMMAR = (
    f"a list of nodes, each {keys_grammar(NODE)} "
    f"({' and '.join(n for n, k in NODE.keys.items() if isinstance(k, Key) and k.required)} "
    "required)"
)
TOP_GRAMMAR = f"{keys_grammar(SPEC)}, nodes"


class SpecError(Exception):
    """The spec is invalid; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass
class _Ctx:
    file: str
    lines: dict[PathT, int]
    problems: list[str]
    booleans: dict[PathT, str]  # the word of each YAML boolean, as written (`on`)

    def add(self, path: PathT, message: str) -> None:
        line = self._line_of(path)
        where = f"{self.file}:{line}" if line else self.file
        self.problems.append(f"{where}: {dotted(path) or '(top level)'}: {message}")

    def refuse(self, path: PathT, message: str, grammar: str, subject: str = "") -> None:
        """A value its key's grammar refuses: what is wrong, then what the key (``subject``, when
        not the key at ``path``) accepts."""
        sep = " " if message.endswith("?") else "; "  # after a question, a sentence of its own
        self.add(path, f"{message}{sep}{subject + ' ' if subject else ''}accepts: {grammar}")

    def boolean_hint(self, path: PathT, value: Any, check: Check | None) -> str:
        """Where a string is wanted, a YAML boolean is most likely an unquoted word (`ib: on`):
        say so, and whether that word, quoted, would do (``check``: the grammar it would meet)."""
        if not isinstance(value, bool):
            return ""
        word = self.booleans.get(path, str(value).lower())
        fits = [w for w in dict.fromkeys((word, word.lower())) if check is None or not check(w)]
        fix = f': "{fits[0]}"' if fits else f", but {word!r} is not accepted either"
        return (
            f" (YAML reads {YAML_BOOLEANS} unquoted as booleans: quote such a word where a string "
            f"is meant{fix})"
        )

    def _line_of(self, path: PathT) -> int | None:
        while path not in self.lines and path:
            path = path[:-1]
        return self.lines.get(path)


def dotted(path: PathT) -> str:
    """``nodes[0].ssh.port``; a key that is not a plain word is shown quoted, so a problem stays one
    line."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not re.fullmatch(r"[A-Za-z0-9_-]+", part):
            out += f"[{part!r}]"
        else:
            out += f".{part}" if out else part
    return out


@dataclass
class _LineMap:
    lines: dict[PathT, int]  # each key path -> its 1-based line
    repeated: list[tuple[PathT, int, int]]  # (path, line, first line) of each repeated key
    booleans: dict[PathT, str]  # each boolean scalar's path -> the word as written


def _line_map(document: yaml.Node) -> _LineMap:
    """Map each key path of a composed YAML document to its 1-based line; also collect every
    repeated mapping key (YAML loaders keep the last silently) and the words YAML took for
    booleans."""
    lines: dict[PathT, int] = {}
    repeated: list[tuple[PathT, int, int]] = []
    booleans: dict[PathT, str] = {}
    seen: set[int] = set()  # aliased nodes are walked once: no blow-up on nested aliases

    def walk(node: yaml.Node, path: PathT) -> None:
        lines.setdefault(path, node.start_mark.line + 1)
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[str, int] = {}
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    sub = path + (key_node.value,)
                    line = key_node.start_mark.line + 1
                    if key_node.value in first:
                        repeated.append((sub, line, first[key_node.value]))
                    first.setdefault(key_node.value, line)
                    lines.setdefault(sub, line)
                    walk(value_node, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, path + (i,))
        elif node.tag == _BOOL_TAG:
            booleans.setdefault(path, node.value)

    walk(document, ())
    return _LineMap(lines, repeated, booleans)


def _type_ok(value: Any, expected: type | tuple[type, ...]) -> bool:
    # YAML's `true` is a bool, which Python also counts as an int: never accept it as one.
    if isinstance(value, bool):
        return expected is bool or (isinstance(expected, tuple) and bool in expected)
    return isinstance(value, expected)


def _validate_section(section: Section, data: Any, path: PathT, ctx: _Ctx) -> dict[str, Any]:
    """Return the section with defaults filled in; record problems in ctx."""
    if data is None:
        data = {}
    grammar = TOP_GRAMMAR if section is SPEC else keys_grammar(section)
    if not isinstance(data, dict):
        ctx.refuse(path, f"must be a mapping, got {type_name(type(data))} {_shown(data)}", grammar)
        return _defaults(section)
    result: dict[str, Any] = {}
    for key in data:
        if key not in section.keys and not (section is SPEC and key == "nodes"):
            allowed = list(section.keys) + (["nodes"] if section is SPEC else [])
            near = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            # What the section takes, named: the unknown key is not what accepts it.
            ctx.refuse(
                path + (str(key),),
                f"unknown key{hint}",
                grammar,
                subject=dotted(path) or "the spec",
            )
    for name, key in section.keys.items():
        sub = path + (name,)
        if isinstance(key, Section):
            result[name] = _validate_section(key, data.get(name), sub, ctx)
        elif name not in data:
            if key.required:
                ctx.refuse(path, f"missing required key {name!r}", key.accepts, subject=name)
            result[name] = _copy(key.default)
        else:
            result[name] = _validate_value(key, data[name], sub, ctx)
    return result


def _validate_value(key: Key, value: Any, path: PathT, ctx: _Ctx) -> Any:
    if not _type_ok(value, key.type):
        types = key.type if isinstance(key.type, tuple) else (key.type,)
        hint = ctx.boolean_hint(path, value, key.check) if str in types else ""
        ctx.refuse(
            path,
            f"must be {_a(type_name(key.type))}, got {type_name(type(value))} {_shown(value)}"
            + hint,
            key.accepts,
        )
        return _copy(key.default)
    if key.items is not None:
        bad = [(i, v) for i, v in enumerate(value) if not _type_ok(v, key.items)]
        if bad:
            i, item = bad[0]
            hint = ctx.boolean_hint(path + (i,), item, key.each) if key.items is str else ""
            ctx.refuse(
                path,
                f"every item must be {_a(type_name(key.items))}, got {_shown(item)}{hint}",
                key.accepts,
            )
            return _copy(key.default)
    if value is not None and key.check is not None:
        problem = key.check(value)
        if problem:
            ctx.refuse(path, problem, key.accepts)
    if key.each is not None or key.each_key is not None:
        _validate_entries(key, value, path, ctx)
    return value


def _a(noun: str) -> str:
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"


def _shown(value: Any) -> str:
    """A value of the wrong type, shortened: YAML aliases can nest a list 2**40 items deep."""
    return repr(value) if isinstance(value, (str, int, float, type(None))) else _SHORT.repr(value)


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict = 3, 4, 4


def _validate_entries(key: Key, value: list[Any] | dict[Any, Any], path: PathT, ctx: _Ctx) -> None:
    """The grammar of every list item, or of every mapping key and value, reported at that entry."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            if key.each is not None and (problem := key.each(item)):
                hint = ctx.boolean_hint(path + (i,), item, key.each)
                ctx.refuse(path + (i,), problem + hint, key.accepts)
        return
    for name, item in value.items():
        sub = path + (str(name),)
        if key.each_key and (problem := key.each_key(name)):
            ctx.refuse(sub, problem, key.accepts)
        elif key.each and (problem := key.each(item)):
            ctx.refuse(sub, problem + ctx.boolean_hint(sub, item, key.each), key.accepts)


def _defaults(section: Section) -> dict[str, Any]:
    return {
        name: _defaults(key) if isinstance(key, Section) else _copy(key.default)
        for name, key in section.keys.items()
    }


def _copy(value: Any) -> Any:
    return type(value)(value) if isinstance(value, (list, dict)) else value


def _validate_nodes(data: dict[str, Any], ctx: _Ctx) -> list[dict[str, Any]]:
    if "nodes" not in data:
        ctx.refuse((), "missing required key 'nodes' (the list of servers)", NODES_GRAMMAR)
        return []
    raw = data["nodes"]
    if raw is None:
        ctx.refuse(
            ("nodes",), "no nodes: the spec needs at least one entry under 'nodes'", NODES_GRAMMAR
        )
        return []
    if not isinstance(raw, list):
        ctx.refuse(
            ("nodes",), f"must be a list of nodes, got {type_name(type(raw))}", NODES_GRAMMAR
        )
        return []
    if not raw:
        ctx.refuse(("nodes",), "is empty: the spec needs at least one node", NODES_GRAMMAR)
        return []
    items, origins = _expand_node_sets(raw, ctx)
    start = len(ctx.problems)
    nodes = [
        _validate_section(NODE, item, ("nodes", i), ctx)
        for item, i in zip(items, origins, strict=True)
    ]
    # a node set's other keys are every node's: a problem with one is said once
    ctx.problems[start:] = list(dict.fromkeys(ctx.problems[start:]))
    # Per-node sections are overrides: keep only what the node sets, so the
    # cluster-wide values apply to the rest.
    for node, item in zip(nodes, items, strict=True):
        for sub in ("ssh", "nccl"):
            given = item.get(sub) if isinstance(item, dict) else None
            node[sub] = {
                k: v for k, v in node[sub].items() if isinstance(given, dict) and k in given
            }
    for attr in ("name", "address"):
        seen: dict[object, int] = {}
        for i, node in enumerate(nodes):
            value = node.get(attr)
            if not isinstance(value, str):
                continue
            norm = _identity(attr, value)
            if norm in seen:
                ctx.add(
                    ("nodes", origins[i], attr),
                    f"duplicate {attr} {value!r} (also nodes[{origins[seen[norm]]}])",
                )
            else:
                seen[norm] = i
    return nodes


NODE_SET_GRAMMAR = (
    "a node set of names (gpu[001-200], rack[1-2]-gpu[01-16]) with its addresses as a matching "
    "range (192.0.2.[1-200]) or a first IP address counted up within its subnet"
)


def _expand_node_sets(raw: list[Any], ctx: _Ctx) -> tuple[list[Any], list[int]]:
    """The node entries with each node set expanded, one entry per name, and each entry's index
    in the spec's list (where its problems are reported). A single entry after a set that names
    one of its nodes overrides that node's keys; a name given again otherwise is left to the
    duplicate check, and a set that repeats an earlier name is refused here."""
    items: list[Any] = []
    origins: list[int] = []
    named: dict[str, int] = {}  # each name so far (lower case) -> its position in items
    from_sets: set[str] = set()  # the names a set gave that no single entry overrode yet
    for i, item in enumerate(raw):
        name = item.get("name") if isinstance(item, dict) else None
        if isinstance(name, str) and node_sets.is_node_set(name):
            for node in _node_set(item, ("nodes", i), ctx):
                key = node["name"].lower()
                if key in named:
                    ctx.add(
                        ("nodes", i, "name"),
                        f"node set {name!r} gives {node['name']!r} again "
                        f"(also nodes[{origins[named[key]]}])",
                    )
                    continue
                named[key] = len(items)
                from_sets.add(key)
                items.append(node)
                origins.append(i)
            continue
        if isinstance(name, str) and name.lower() in from_sets:
            from_sets.discard(name.lower())
            position = named[name.lower()]
            items[position] = _overridden(items[position], item)
            origins[position] = i
            continue
        if isinstance(name, str):
            named.setdefault(name.lower(), len(items))
        items.append(item)
        origins.append(i)
    return items, origins


def _overridden(node: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """A node of a set with a later single entry's keys over its own (a section key by key)."""
    merged = dict(node)
    for key, value in entry.items():
        base = node.get(key)
        both = isinstance(value, dict) and isinstance(base, dict)
        merged[key] = {**base, **value} if both else value  # type: ignore[dict-item]
    return merged


def _node_set(item: dict[str, Any], path: PathT, ctx: _Ctx) -> list[dict[str, Any]]:
    """One entry per name of the entry's node set, each with its address; [] where the set, or
    its addresses, cannot be expanded (the problem recorded at the key)."""
    try:
        names = node_sets.expand(item["name"])
    except ValueError as exc:
        ctx.refuse(path + ("name",), str(exc), NODE_SET_GRAMMAR)
        return []
    address = item.get("address")
    if not isinstance(address, str):
        return [{**item, "name": name} for name in names]  # the address's problem: its grammar
    try:
        if node_sets.is_node_set(address):
            addresses = node_sets.expand(address)
        elif address_problem(address) is None:
            addresses = node_sets.count_up(address, len(names))
        else:
            raise ValueError(f"{address!r} is neither an address range nor an IP address")
    except ValueError as exc:
        ctx.refuse(path + ("address",), str(exc), NODE_SET_GRAMMAR)
        return []
    if len(addresses) != len(names):
        ctx.refuse(
            path + ("address",),
            f"{len(addresses)} addresses ({address}) for {len(names)} names ({item['name']})",
            NODE_SET_GRAMMAR,
        )
        return []
    return [{**item, "name": n, "address": a} for n, a in zip(names, addresses, strict=True)]


def _identity(attr: str, value: str) -> object:
    """What makes two nodes the same: the name case-insensitively (DNS), the address as parsed.

    Exact comparisons only: a name with a trailing newline is refused by the grammar, not
    taken for a second node."""
    if attr == "name":
        return value.lower()
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return value


def _cross_checks(spec: dict[str, Any], ctx: _Ctx) -> None:
    """Rules between keys, checked before any host is touched."""
    _stack_rules(spec["stack"], ctx)
    _mesh_user_rules(spec["cluster"]["mesh_users"], ctx)
    _fqdn_rules(spec, ctx)
    _ssh_user_rules(spec, ctx)
    _driver_rules(spec["stack"], ctx)
    _preflight_python_rules(spec, ctx)
    if not spec["cluster"]["mixed_subnets"]:
        _subnet_rules(spec["nodes"], ctx)


def _preflight_python_rules(spec: dict[str, Any], ctx: _Ctx) -> None:
    """An existing env's python only where the stack is not managed: a managed stack's preflight
    tests the venv the deploy pinned and drift compares, never another env that may differ."""
    python = spec["preflight"]["python"]
    if python and not preflight_python_problem(python) and spec["manage"]["stack"]:
        ctx.add(
            ("preflight", "python"),
            "an existing env's python needs manage.stack: false (a managed stack's preflight "
            "tests trainfleet's venv, the one the deploy pins)",
        )


def _subnet_rules(nodes: list[dict[str, Any]], ctx: _Ctx) -> None:
    """Three or more IPv4 nodes, all but one in one /24: the one outside is most likely a typo
    (192.0.12.11 among 192.0.2.x), refused with its line; ``cluster.mixed_subnets`` allows it."""
    subnets: dict[int, ipaddress.IPv4Network] = {}
    for i, node in enumerate(nodes):
        try:
            address = ipaddress.ip_address(str(node.get("address")))
        except ValueError:
            continue
        if isinstance(address, ipaddress.IPv4Address):
            subnets[i] = ipaddress.IPv4Network(f"{address}/24", strict=False)
    counts = Counter(subnets.values())
    if len(subnets) < 3 or len(counts) != 2 or min(counts.values()) != 1:
        return
    shared = max(counts, key=counts.__getitem__)
    for i, subnet in subnets.items():
        if subnet != shared:
            ctx.add(
                ("nodes", i, "address"),
                f"{nodes[i]['address']} is outside {shared}, where the other "
                f"{counts[shared]} nodes are: a typo? (a node that really is elsewhere: "
                "cluster.mixed_subnets: true)",
            )


def _stack_rules(stack: dict[str, Any], ctx: _Ctx) -> None:
    if stack["wheelhouse"] and stack["torch_index"]:
        ctx.add(("stack", "torch_index"), "give stack.wheelhouse or stack.torch_index, not both")
    for key in ("cudnn", "nccl"):
        if stack[key] and not stack["cuda"] and "+cuda" not in stack[key]:
            ctx.add(
                ("stack", key),
                f"pinning {key} needs stack.cuda (its packages are built per CUDA version)",
            )
    seen_dists: dict[str, str] = {}
    for name in stack["python"]:
        other = seen_dists.setdefault(normalized_dist(name), name)
        if other != name:
            ctx.add(
                ("stack", "python", name),
                f"{name!r} is the same package as {other!r} (pip compares names "
                "case- and separator-blind)",
            )
    if stack["python"] and not stack["torch"]:
        ctx.add(
            ("stack", "python"), "pinning python packages needs stack.torch (they go into its venv)"
        )
    if stack["torch"] and not stack["torch_cuda"] and "+" not in stack["torch"]:
        ctx.add(("stack", "torch"), "pinning torch needs stack.torch_cuda (e.g. cu124, or cpu)")
    for key in ("cuda_repo", "torch_index"):
        url = stack[key]
        if isinstance(url, str) and url.startswith("http://") and not stack["insecure"]:
            ctx.add(
                ("stack", key),
                f"{url!r} is plain http: packages could be swapped in transit; "
                "use https, or set stack.insecure: true (never for production)",
            )


def _mesh_user_rules(users: list[str], ctx: _Ctx) -> None:
    for i, user in enumerate(users):
        if user in users[:i]:
            ctx.add(
                ("cluster", "mesh_users", i),
                f"duplicate mesh user {user!r} (also mesh_users[{users.index(user)}])",
            )


def _fqdn_rules(spec: dict[str, Any], ctx: _Ctx) -> None:
    domain = spec["cluster"]["domain"]
    for i, node in enumerate(spec["nodes"]):
        if domain and isinstance(node.get("name"), str) and len(f"{node['name']}.{domain}") > 253:
            ctx.add(
                ("nodes", i, "name"),
                f"{node['name'] + '.' + domain!r} is longer than 253 characters",
            )


def _ssh_user_rules(spec: dict[str, Any], ctx: _Ctx) -> None:
    """A login user other than root needs ``become: sudo``: trainfleet writes /etc as root."""
    if spec["ssh"]["user"] != "root" and spec["ssh"]["become"] != "sudo":
        ctx.add(
            ("ssh", "user"),
            f"{spec['ssh']['user']!r} is not root: trainfleet writes /etc as root, so set "
            "ssh.become: sudo (passwordless sudo for that user) or connect as root",
        )
    for i, node in enumerate(spec["nodes"]):
        if not isinstance(node.get("ssh"), dict) or not ({"user", "become"} & set(node["ssh"])):
            continue
        ssh = {**spec["ssh"], **node["ssh"]}
        if ssh["user"] != "root" and ssh["become"] != "sudo":
            ctx.add(
                ("nodes", i, "ssh", "user"),
                f"{ssh['user']!r} is not root: trainfleet writes /etc as root, so set "
                "ssh.become: sudo (passwordless sudo for that user) or connect as root",
            )


def _driver_rules(stack: dict[str, Any], ctx: _Ctx) -> None:
    """A pinned driver older than the pinned CUDA needs is refused here, with both versions;
    without a toolkit pin, the CUDA that torch's wheels are built for (``cu124``: 12.4).
    Only between pins their grammar accepts: a refused one is reported once, at its key."""
    if not all(_grammatical(STACK.keys[name], stack[name]) for name in ("cuda", "driver")):
        return
    cuda = stack["cuda"]
    variant = stack["torch_cuda"]
    if not cuda and isinstance(variant, str):
        cuda = variant_cuda(variant)
    if cuda and stack["driver"] and (problem := driver_for_cuda_problem(stack["driver"], cuda)):
        ctx.add(
            ("stack", "driver"), problem + ("" if stack["cuda"] else f" (torch_cuda: {variant})")
        )


def _grammatical(key: Key | Section, value: Any) -> bool:
    return isinstance(key, Key) and (value is None or key.check is None or not key.check(value))


def parse_spec(text: str, file: str = DEFAULT_SOURCE) -> dict[str, Any]:
    """Validate spec text; return the spec with every default filled in, or raise SpecError."""
    try:
        document = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{file}:{mark.line + 1}" if mark else file
        raise SpecError(
            [f"{where}: (top level): not valid YAML: {getattr(exc, 'problem', exc)}"]
        ) from None
    found = _line_map(document) if document else _LineMap({}, [], {})
    ctx = _Ctx(file=file, lines=found.lines, problems=[], booleans=found.booleans)
    for path, line, first in found.repeated:
        ctx.problems.append(
            f"{file}:{line}: {dotted(path)}: repeated key (also line {first}); give each key once"
        )
    if data is None:
        data = {}
    if not isinstance(data, dict):
        ctx.refuse(
            (),
            f"the spec must be a mapping with a 'nodes' list, got {type_name(type(data))}",
            TOP_GRAMMAR,
        )
        raise SpecError(ctx.problems)
    spec = _validate_section(SPEC, data, (), ctx)
    spec["nodes"] = _validate_nodes(data, ctx)
    _cross_checks(spec, ctx)
    if spec["cluster"]["name"] is None:
        spec["cluster"]["name"] = _name_from_file(file, ctx)
    if ctx.problems:
        raise SpecError(ctx.problems)
    return spec


def _name_from_file(file: str, ctx: _Ctx) -> str:
    """The cluster's name when the spec gives none: the file's stem, under the same grammar."""
    name = "spec" if file == DEFAULT_SOURCE else Path(file).stem
    problem = cluster_name_problem(name)
    if problem:
        key = CLUSTER.keys["name"]
        assert isinstance(key, Key)  # a value, not a section
        ctx.refuse(
            ("cluster", "name"),
            f"not set, and the spec file's name is no cluster name: {problem}",
            key.accepts,
        )
    return name


def load_spec(path: str | Path) -> dict[str, Any]:
    """Read and validate the spec file at ``path``."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError([f"{path}: cannot read the spec: {exc.strerror}"]) from None
    return parse_spec(text, str(path))


def load_cluster(path: str | Path) -> Cluster:
    """The cluster of the spec file at ``path``, validated."""
    return Cluster.from_spec(load_spec(path), str(path))


def parse_cluster(text: str, source: str = DEFAULT_SOURCE) -> Cluster:
    """The cluster of a spec's text, validated; ``source`` is the file it came from."""
    return Cluster.from_spec(parse_spec(text, source), source)
