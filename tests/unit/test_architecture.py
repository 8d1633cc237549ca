"""Static checks of src/taiji's shape (docs/design.md#parts, issue #10), read with ``ast``/``tokenize``.

1. ``test_imports_layers_and_sizes``: the import graph (every import statement, including those
   inside functions and under ``if TYPE_CHECKING:``, relative imports resolved) has no cycle
   between modules, no cycle between the layer-1 packages, and no import pointing *up* the layers
   below; only the package root imports ``taiji.runtime.job``; no other runtime module names
   ``job.`` in code; and files stay under their line budgets.
2. ``test_no_reach_into_private_members``: no module names another object's private member
   (``X._name`` where X is not ``self``/``cls``/``super()``), beyond a tiny allowlist of third-party
   APIs that have no public spelling.
3. ``test_launch_rooms_meet_only_through_their_doors``: launch/'s three rooms (one job's launcher,
   other hosts, the live scheduler; a folder of launch/ is a room) import each other only through
   named parts (``LAUNCH_DOORS``), and only one way: no two rooms import each other.

Every violation is listed as ``file:line`` in the failure message.
"""

from __future__ import annotations

import ast
import functools
import io
import tokenize
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from taiji_harness.testing import REPO

SRC = REPO / "src"
PACKAGE = SRC / "taiji"
TESTS = REPO / "tests"

# Low to high; a module may import its own layer (without cycles) and lower ones only.
LAYERS: dict[str, int] = {
    "taiji.errors": 0,
    "taiji.env": 0,
    "taiji.log": 0,
    "taiji.cluster": 1,
    "taiji.data": 1,
    "taiji.monitor": 1,
    "taiji.comm": 1,
    "taiji.policies": 1,
    "taiji.metrics": 1,
    "taiji.sched": 1,
    "taiji.checkpoint": 1,
    "taiji.strategies": 2,
    "taiji.runtime": 3,
    "taiji.launch": 4,
    "taiji": 4,  # "taiji" is the package root, taiji/__init__.py, only
    "taiji.integrations": 5,  # frameworks' loops on the user's API (taiji.Job), above the root
}
LAYER1 = sorted(name for name, layer in LAYERS.items() if layer == 1)

# launch/ holds three rooms: one job's launcher, the other hosts of a job, and the live scheduler.
# A folder of launch/ is a room (every module under it is the room's); launch/'s top-level modules
# are the job's room, beside the shared parts and the entry point. A module may import its own room,
# the shared parts, and another room only through that room's doors (the named parts below);
# ``cli`` is the entry point (with the command line it parses), which may open every door. Between
# two rooms, imports run one way only: no rooms import each other, directly or round a cycle.
LAUNCH_SHARED = {"options", "supervisor", "worker_env", "registry", "control_socket", "metrics_http"}
LAUNCH_ENTRY = {"cli", "parser", "arguments"}
LAUNCH_TOP_ROOM = "job"
LAUNCH_FOLDER_ROOMS = {"hosts", "sched"}
LAUNCH_DOORS: dict[str, set[str]] = {
    # `taiji run`, `top`, `resize`/`status`/`ls` and `checkpoint`; `taiji join`'s takeover, handed to
    # the agent; the live scheduler reads the launcher's exit codes from checkpoint_cli
    "job": {"run", "top", "control_cli", "checkpoint_cli", "takeover"},
    # the driver addresses the agents through remote and agent_channel; `taiji join`, `taiji drain`
    # and `srun`'s tasks are commands of this room; `taiji run --ray` and `taiji sched serve --ray`
    # connect through ray.nodes and place ray.agent's per-node actor
    "hosts": {
        "hosts.agent",
        "hosts.agent_channel",
        "hosts.remote",
        "hosts.drain",
        "hosts.slurm_task",
        "hosts.ray.nodes",
        "hosts.ray.agent",
    },
    "sched": {"sched.cli"},
}

# Budgets count lines as `ruff format` writes them (pyproject.toml), so they measure design, not density.
MAX_LINES = 600
MAX_LINES_JOB = (
    420  # runtime/job.py: the user's Job, its public surface and its loop (parts: runtime/worker.py)
)
MAX_LINES_RUNTIME = 350  # every other file under runtime/

# ``X._name`` spellings that are allowed, each with its reason. Keep this tiny: a private member
# of our own code is never allowed; an entry here is a third-party API with no public spelling.
ALLOWED_PRIVATE = {
    "os._exit": "documented: exit at once, without cleanup handlers (a child after fork, a fault)",
    "opts._timeout": "torch's gloo/NCCL Options expose the collective timeout only under this name",
    "opts._devices": "torch's gloo Options expose the transport devices (bound address) only here",
    "dist.ProcessGroupGloo._Options": "the only gloo Options class ProcessGroupGloo(store, rank, "
    "size, options) accepts (torch 2.x); needed to pass _devices",
}


# -- reading the source -------------------------------------------------------------------------


def source_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def rel(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def module_of(path: Path, src: Path | None = None) -> str:
    parts = list(path.relative_to(src or SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int | None:
    if module == "taiji":
        return LAYERS["taiji"]
    for prefix, layer in LAYERS.items():
        if prefix != "taiji" and (module == prefix or module.startswith(prefix + ".")):
            return layer
    return None


def top_package(module: str) -> str:
    return ".".join(module.split(".")[:2])


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module (a module or package of src/taiji)
    path: Path
    line: int
    type_checking: bool  # under ``if TYPE_CHECKING:``

    @property
    def where(self) -> str:
        return f"{rel(self.path)}:{self.line}" + (" (TYPE_CHECKING)" if self.type_checking else "")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, modules: set[str], src: Path | None = None) -> tuple[list[Import], list[str]]:
    """Every import of a src/taiji module in ``path``, resolved; plus unresolved ``taiji`` names."""
    module = module_of(path, src)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []
    unresolved: list[str] = []

    def resolve(name: str) -> str | None:
        """The longest prefix of the dotted ``name`` that is a module of src/taiji."""
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            candidate = ".".join(parts[:i])
            if candidate in modules:
                return candidate
        return None

    def add(target: str | None, name: str, node: ast.stmt, tc: bool) -> None:
        if target is not None:
            found.append(Import(module, target, path, node.lineno, tc))
        elif name == "taiji" or name.startswith("taiji."):
            unresolved.append(f"{rel(path)}:{node.lineno}: cannot resolve {name!r}")

    def visit(node: ast.AST, tc: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, tc)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(resolve(alias.name), alias.name, node, tc)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if alias.name != "*" and submodule in modules:  # from pkg import submodule
                    add(submodule, submodule, node, tc)
                else:  # from module import name
                    add(base if base in modules else None, base, node, tc)
        for child in ast.iter_child_nodes(node):
            visit(child, tc)

    visit(ast.parse(path.read_text(), filename=str(path)), False)
    return found, unresolved


@functools.cache  # read once for every test here
def import_graph() -> tuple[list[Import], list[str]]:
    files = source_files()
    modules = {module_of(p) for p in files}
    edges: list[Import] = []
    unresolved: list[str] = []
    for path in files:
        found, bad = imports_of(path, modules)
        edges += dict.fromkeys(found)  # one per statement and target, in order
        unresolved += bad
    return edges, unresolved


def components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` that hold a cycle, each sorted (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return sorted(found)


def shortest_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first member, staying inside the component."""
    start, members = component[0], set(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier and start not in previous:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w in members and w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    path = [start]
    v = previous[start]
    while v != start:
        path.append(v)
        v = previous[v]
    return [start] + path[1:][::-1] + [start]


def describe_cycles(graph: dict[str, set[str]], where: dict[tuple[str, str], str]) -> list[str]:
    """Per cyclic component: a cycle, its members, and every import inside it with its place."""
    lines = []
    for component in components(graph):
        lines.append(f"  cycle: {' -> '.join(shortest_cycle(graph, component))}")
        lines.append(f"    component of {len(component)}: {', '.join(component)}; its imports:")
        lines += [
            f"      {a} -> {b}  at {where[a, b]}"
            for a in component
            for b in sorted(graph[a])
            if b in component
        ]
    return lines


def dotted_uses(path: Path, name: str) -> dict[int, list[str]]:
    """``{line: ["name.attr", ...]}`` wherever ``name.`` appears in code, i.e. the regex
    ``\\bname\\.`` outside strings, comments and docstrings (read with tokenize)."""
    tokens = [
        t
        for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT)
    ]
    uses: dict[int, list[str]] = defaultdict(list)
    for t, dot, attr in zip(tokens, tokens[1:], tokens[2:] + [None], strict=False):
        if t.type == tokenize.NAME and t.string == name and dot.type == tokenize.OP and dot.string == ".":
            uses[t.start[0]].append(f"{name}.{attr.string if attr is not None else ''}")
    return dict(uses)


def private_reaches(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``(line, "X._name", "X")`` for each private attribute named on an object other than
    ``self``, ``cls`` or ``super()``; dunders are public."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
            continue
        found.append((node.lineno, ast.unparse(node), ast.unparse(owner)))
    return sorted(found)


def grouped(problems: list[tuple[str, str]]) -> str:
    """``(file:line, message)`` pairs as one block per file, in line order."""
    by_file: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for where, message in problems:
        path, _, line = where.partition(":")
        by_file[path].append((int(line.split()[0]), f"    {where}: {message}"))
    return "\n".join(
        f"  {path} ({len(lines)})\n" + "\n".join(text for _, text in sorted(lines))
        for path, lines in sorted(by_file.items())
    )


# -- the tests ----------------------------------------------------------------------------------


def test_imports_layers_and_sizes():
    edges, unresolved = import_graph()
    report: list[str] = []
    if unresolved:
        report.append("unresolved imports of taiji:\n  " + "\n  ".join(unresolved))

    # every module has a layer
    unlayered = sorted({module_of(p) for p in source_files() if layer_of(module_of(p)) is None})
    if unlayered:
        report.append(f"modules with no layer (add their package to LAYERS): {unlayered}")

    # cycles between modules; TYPE_CHECKING imports count too
    first: dict[tuple[str, str], Import] = {}
    for edge in sorted(edges, key=lambda e: (e.type_checking, e.line)):
        if edge.source != edge.target:
            first.setdefault((edge.source, edge.target), edge)
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target in first:
        graph[source].add(target)
    module_cycles = describe_cycles(graph, {key: edge.where for key, edge in first.items()})
    if module_cycles:
        report.append("import cycles between modules:\n" + "\n".join(module_cycles))

    # cycles between the layer-1 packages
    packages: dict[str, set[str]] = defaultdict(set)
    package_edge: dict[tuple[str, str], Import] = {}
    for (source, target), edge in first.items():
        a, b = top_package(source), top_package(target)
        if a != b and a in LAYER1 and b in LAYER1:
            packages[a].add(b)
            package_edge.setdefault((a, b), edge)
    package_cycles = describe_cycles(
        packages,
        {key: f"{edge.where} ({edge.source} -> {edge.target})" for key, edge in package_edge.items()},
    )
    if package_cycles:
        report.append("import cycles between layer-1 packages:\n" + "\n".join(package_cycles))

    # upward imports (a TYPE_CHECKING import is allowed only where a real one would be)
    upward = []
    for edge in sorted(edges, key=lambda e: (rel(e.path), e.line)):
        low, high = layer_of(edge.source), layer_of(edge.target)
        if low is not None and high is not None and high > low:
            upward.append((edge.where, f"{edge.source} (layer {low}) imports {edge.target} (layer {high})"))
    if upward:
        report.append(f"{len(upward)} upward import(s):\n" + grouped(upward))

    # runtime/job.py is the composer: imported by the package root only
    job_imports = [
        (e.where, f"{e.source} imports taiji.runtime.job")
        for e in edges
        if e.target == "taiji.runtime.job" and e.source != "taiji"
    ]
    if job_imports:
        report.append("imports of taiji.runtime.job outside taiji/__init__.py:\n" + grouped(job_imports))

    # no runtime part reaches into the Job
    names_job = [
        (f"{rel(path)}:{line}", ", ".join(uses))
        for path in sorted((PACKAGE / "runtime").rglob("*.py"))
        if path.name != "job.py"
        for line, uses in dotted_uses(path, "job").items()
    ]
    if names_job:
        report.append("runtime modules other than job.py that name `job.` in code:\n" + grouped(names_job))

    # line budgets
    too_long = []
    for path in source_files():
        lines = len(path.read_text().splitlines())
        if path == PACKAGE / "runtime" / "job.py":
            limit = MAX_LINES_JOB
        elif (PACKAGE / "runtime") in path.parents:
            limit = MAX_LINES_RUNTIME
        else:
            limit = MAX_LINES
        if lines > limit:
            too_long.append(f"  {rel(path)}: {lines} lines > {limit}")
    if too_long:
        report.append("files over their line budget:\n" + "\n".join(too_long))

    if report:
        pytest.fail("src/taiji's architecture is broken:\n\n" + "\n\n".join(report), pytrace=False)


def launch_room_of(module: str) -> str | None:
    """The room of a launch/ module (short name: ``driver``, ``hosts.ray.agent``); None for the
    shared parts, the entry point and launch/ itself."""
    if module in LAUNCH_SHARED or module in LAUNCH_ENTRY or module == "":
        return None
    folder, dot, _ = module.partition(".")
    return folder if dot or folder in LAUNCH_FOLDER_ROOMS else LAUNCH_TOP_ROOM


def launch_room_problems(edges: list[tuple[str, str, str]], modules: set[str]) -> list[tuple[str, str]]:
    """(where, why) for each import between launch/ modules (short names) that breaks the rooms,
    and for each cycle between rooms (two rooms that import each other, or a longer round)."""
    problems = [
        (f"launch/{m.replace('.', '/')}.py:1", f"{m} is in a folder of launch/ that is no room ({room})")
        for m in sorted(modules)
        if (room := launch_room_of(m)) not in LAUNCH_FOLDER_ROOMS | {LAUNCH_TOP_ROOM, None}
    ]
    rooms: dict[str, set[str]] = defaultdict(set)
    first: dict[tuple[str, str], str] = {}
    for where, source, target in edges:
        room, target_room = launch_room_of(source), launch_room_of(target) or ""
        doors = LAUNCH_DOORS.get(target_room, set())
        if source == target or target in LAUNCH_SHARED or target == "":
            continue  # the shared parts are open to every module
        if source in LAUNCH_ENTRY:
            if target not in LAUNCH_ENTRY and target not in doors:
                problems.append((where, f"entry {source} imports {target}, not a door of room {target_room}"))
        elif target in LAUNCH_ENTRY:
            problems.append((where, f"{source} imports the entry point's {target}"))
        elif room is None:
            problems.append((where, f"shared part {source} imports {target}"))
        elif room != target_room:
            if target not in doors:
                problems.append(
                    (where, f"{source} ({room}) imports {target}, which is not a door of room {target_room}")
                )
            rooms[room].add(target_room)
            first.setdefault((room, target_room), f"{where} ({source} -> {target})")
    for component in components(rooms):
        cycle = shortest_cycle(rooms, component)
        through = "; ".join(first[a, b] for a, b in zip(cycle, cycle[1:], strict=False))
        problems.append(
            ("launch/__init__.py:1", f"rooms import each other: {' -> '.join(cycle)}, at {through}")
        )
    return problems


def test_launch_rooms_meet_only_through_their_doors():
    edges, _ = import_graph()
    prefix = "taiji.launch."
    launch = [
        (e.where, e.source.removeprefix("taiji.launch").removeprefix("."), e.target[len(prefix) :])
        for e in edges
        if e.source.startswith("taiji.launch") and e.target.startswith(prefix)
    ]
    modules = {
        ".".join(p.relative_to(PACKAGE / "launch").with_suffix("").parts).removesuffix("__init__").rstrip(".")
        for p in (PACKAGE / "launch").rglob("*.py")
    }
    problems = launch_room_problems(launch, modules)
    if problems:
        pytest.fail("launch/'s rooms import each other sideways:\n" + grouped(problems), pytrace=False)
    assert {launch_room_of(m) for m in modules} == {"job", "hosts", "sched", None}
    assert launch_room_of("hosts.ray.agent") == "hosts" and launch_room_of("takeover") == "job"
    made_up = launch_room_problems(
        [
            ("x:1", "sched.daemon", "etcd_server"),
            ("x:2", "registry", "driver"),
            ("x:3", "hosts.agent", "takeover"),
            ("x:4", "driver", "hosts.remote"),
            ("x:5", "cli", "hosts.tether"),
        ],
        modules | {"stray.part"},
    )
    assert [why.split()[0] for _, why in made_up] == [
        "stray.part",
        "sched.daemon",
        "shared",
        "entry",
        "rooms",
    ]


def test_no_reach_into_private_members():
    problems: list[tuple[str, str]] = []
    used: set[str] = set()
    for path in source_files():
        for line, spelled, owner in private_reaches(ast.parse(path.read_text(), filename=str(path))):
            if spelled in ALLOWED_PRIVATE:
                used.add(spelled)
            else:
                problems.append((f"{rel(path)}:{line}", f"`{spelled}` names a private member of `{owner}`"))
    if problems:
        pytest.fail(
            f"{len(problems)} reach(es) into another object's private members (pass the collaborator "
            f"in, or make the member public):\n" + grouped(problems),
            pytrace=False,
        )
    stale = sorted(set(ALLOWED_PRIVATE) - used)
    assert not stale, f"allowlist entries no longer used (remove them from ALLOWED_PRIVATE): {stale}"


def test_no_test_module_imports_another():
    """Test modules share code through taiji_harness/testing.py only, and their basenames are unique
    (tests/unit, tests/integration and tests/faults are not packages)."""
    test_modules = {p.stem for p in TESTS.rglob("test_*.py")} | {"conftest"}
    problems = []
    for path in sorted(TESTS.rglob("*.py")):
        if "scripts" in path.relative_to(TESTS).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module] if node.module else []
                if node.level:  # from . import test_x
                    names += [alias.name for alias in node.names]
            else:
                continue
            problems += [
                f"  {rel(path)}:{node.lineno}: imports {name}"
                for name in names
                if name.split(".")[0] in test_modules or name.startswith("test_")
            ]
    assert not problems, (
        "test modules import other test modules (move what they share to "
        "taiji_harness/testing.py):\n" + "\n".join(problems)
    )
    names: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        names[path.name].append(rel(path))
    clashes = {name: paths for name, paths in names.items() if len(paths) > 1}
    assert not clashes, f"test module basenames must be unique under tests/: {clashes}"


def test_the_checks_themselves_on_a_made_up_package(tmp_path):
    """The readers above on a small tree: relative imports (``from . import x``, ``from ..a
    import b``), imports inside functions and under TYPE_CHECKING, ``job.`` only in code, private
    members only on other objects."""
    root = tmp_path / "src" / "taiji"
    files = {
        "__init__.py": "from .runtime.job import Job\n",
        "errors.py": "",
        "comm/__init__.py": "from . import wire\nfrom .wire import send as _send\n",
        "comm/wire.py": "def send():\n    from ..errors import X\n    from taiji.cluster.spec import Y\n",
        "cluster/__init__.py": "",
        "cluster/spec.py": "import taiji.comm.wire\n",
        "runtime/__init__.py": "",
        "runtime/job.py": "from . import step\n",
        "runtime/step.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from .job import Job\n"
            '"""job.x in a docstring"""\n'
            "s = 'job.y'  # job.z in a comment\n"
            "def f(job, other):\n"
            "    job.progress = 1\n"
            "    self._ok = super()._ok = cls._ok = other.__dict__\n"
            "    return other._bad, self.peer._worse\n"
        ),
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    paths = sorted(root.rglob("*.py"))
    modules = {module_of(p, root.parent) for p in paths}
    edges = {
        (e.source, e.target, e.type_checking) for p in paths for e in imports_of(p, modules, root.parent)[0]
    }
    assert edges == {
        ("taiji", "taiji.runtime.job", False),
        ("taiji.comm", "taiji.comm.wire", False),
        ("taiji.comm.wire", "taiji.errors", False),
        ("taiji.comm.wire", "taiji.cluster.spec", False),
        ("taiji.cluster.spec", "taiji.comm.wire", False),
        ("taiji.runtime.job", "taiji.runtime.step", False),
        ("taiji.runtime.step", "taiji.runtime.job", True),
    }
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target, _ in edges:
        graph[source].add(target)
    assert components(graph) == [
        ["taiji.cluster.spec", "taiji.comm.wire"],
        ["taiji.runtime.job", "taiji.runtime.step"],
    ]
    assert shortest_cycle(graph, ["taiji.runtime.job", "taiji.runtime.step"]) == [
        "taiji.runtime.job",
        "taiji.runtime.step",
        "taiji.runtime.job",
    ]
    step = root / "runtime" / "step.py"
    assert dotted_uses(step, "job") == {7: ["job.progress"]}
    assert [(line, spelled) for line, spelled, _ in private_reaches(ast.parse(step.read_text()))] == [
        (9, "other._bad"),
        (9, "self.peer._worse"),
    ]
    assert layer_of("taiji") == 4 and layer_of("taiji.launch.cli") == 4 and layer_of("taiji.errors") == 0
    assert layer_of("taiji.comm.wire") == 1 and layer_of("taiji.runtimes") is None
