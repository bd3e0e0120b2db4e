"""House rules that keep the layers apart: who may speak RQ, who may read the environment, which
layer may import which, and what a scheduler's import loads."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "sessionfork"
SOURCES = sorted(PACKAGE.rglob("*.py"))
# The worker's job, seam and worker modules, and the public job function, speak RQ.
RQ_MODULES = {"sessionfork.jobs", "sessionfork.worker.jobs", "sessionfork.worker.rq_seam.worker",
              "sessionfork.worker.rq_seam.entries", "sessionfork.worker.rq_seam.ledger",
              "sessionfork.worker.fork_worker"}
SEAM = "sessionfork.worker.rq_seam"
"""The RQ seam (a package of the worker side: ``worker``, ``entries`` and ``ledger`` import RQ,
``riders`` does not)."""
SEAM_WORKER = ("sessionfork.worker.rq_seam.worker", "SeamWorker")
"""The one subclass of RQ's worker: every override of an RQ worker method is in it."""
RQ_LAYOUT = "sessionfork.protocol.rq_layout"
"""RQ's key names and job hash fields, which producers and workers agree on: no RQ import, but the
one module outside the seam that spells RQ's keys."""
# RQ's documented API: what a module other than the seam may import from rq.
DOCUMENTED_RQ = {"Queue", "Retry", "Worker", "Job", "get_current_job", "DuplicateJobError", "AbandonedJobError",
                 "NoSuchJobError"}
# Entry points read the environment; nothing else does.
ENVIRON_MODULES = {"sessionfork.cli", "sessionfork.jobs"}
# Layers, lowest first: a module imports only from its own layer or a lower one. The two sides of
# the queue share a layer and never import each other: a scheduler's clients load no worker code,
# a worker loads no client. The console (the [console] extra's web app) sits above ops; the CLI
# imports it only inside its command, so `sessionfork` runs without the extra.
LAYERS = [("core",), ("protocol",), ("clients", "worker"), ("ops",), ("console",), ("cli",)]
SIDES = {"clients", "worker"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p) for p in SOURCES}
OUTSIDE_SEAM = [p for p in SOURCES if module_name(p) in RQ_MODULES and not module_name(p).startswith(SEAM)]


def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def imported(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved): ``from ..core
    import errors`` imports ``sessionfork.core`` and, a module of its own, ``sessionfork.core.errors``."""
    name = module_name(path)
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                prefix = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                source = f"{prefix}.{node.module}" if node.module else prefix
            else:
                source = node.module or ""
            if node.module or not node.level:
                found.add(source)
            found |= {f"{source}.{alias.name}" for alias in node.names} & MODULES
    return found


def layer(name: str) -> int | None:
    parts = name.split(".")
    found = [i for i, names in enumerate(LAYERS) if len(parts) > 1 and parts[1] in names]
    return found[0] if found else None


def side(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in SIDES else None


def test_only_the_queue_side_modules_import_rq() -> None:
    speaking = {module_name(p) for p in SOURCES if any(m.split(".")[0] == "rq" for m in imported(p))}
    assert speaking == RQ_MODULES


@pytest.mark.parametrize("path", OUTSIDE_SEAM, ids=module_name)
def test_outside_the_seam_only_documented_rq_names_are_imported(path: Path) -> None:
    names = {alias.name for node in ast.walk(tree(path)) if isinstance(node, ast.ImportFrom)
             and (node.module or "").split(".")[0] == "rq" for alias in node.names}
    assert names <= DOCUMENTED_RQ


@pytest.mark.parametrize("path", OUTSIDE_SEAM, ids=module_name)
def test_outside_the_seam_no_underscore_name_but_its_own(path: Path) -> None:
    # A private name used on any object must be one this module defines itself: RQ's private
    # names (``_status``, ``_result``, ``_stop_requested`` ...) are reached only through the seam.
    module = tree(path)
    own = {n.name for n in ast.walk(module) if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    own |= {t.attr for n in ast.walk(module) if isinstance(n, ast.Assign | ast.AnnAssign)
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Attribute)}
    used = {n.attr for n in ast.walk(module) if isinstance(n, ast.Attribute) and n.attr.startswith("_")
            and not n.attr.startswith("__")}
    assert used <= own


def code_strings(path: Path) -> list[str]:
    """The string constants of a module's code (docstrings excluded: prose may name RQ's keys)."""
    module = tree(path)
    docstrings = {id(n.body[0].value) for n in ast.walk(module)
                  if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(module) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings]


def test_rq_key_layout_is_named_only_in_the_seam() -> None:
    for path in SOURCES:
        if not module_name(path).startswith(SEAM) and module_name(path) != RQ_LAYOUT:
            assert not [s for s in code_strings(path) if "rq:" in s], path
    for script in PACKAGE.rglob("*.lua"):
        # Scripts take their keys from KEYS: RQ's names come from the seam, never spelt in Lua code.
        code = [line for line in script.read_text().splitlines() if not line.lstrip().startswith("--")]
        assert not [line for line in code if "rq:" in line], script


def test_importing_the_package_does_not_import_rq() -> None:
    code = "import sys, sessionfork, sessionfork.core.forks; print(any(m.split('.')[0] == 'rq' for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_command_line_loads_no_console_framework() -> None:
    # `sessionfork` runs without the [console] extra: the console command imports it when it runs.
    code = ("import sys, sessionfork.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in {'starlette', 'uvicorn', 'jinja2'} "
            "or m.startswith('sessionfork.console')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_scheduler_importing_the_client_loads_neither_the_worker_nor_the_fork_service() -> None:
    code = ("import sys, sessionfork.client; "
            "print(sorted(m for m in sys.modules if m.startswith('sessionfork.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(ast.literal_eval(out.stdout.strip()))
    assert "sessionfork.client" in loaded
    assert not loaded & {"sessionfork.worker.fork_worker", "sessionfork.worker.service",
                         "sessionfork.worker.rq_seam.worker", "sessionfork.worker.rq_seam.entries",
                         "sessionfork.cli"}


def classes_by_base() -> dict[str, list[tuple[str, str]]]:
    """Each base class name (as written: ``SimpleWorker``, ``rq.Worker`` as ``Worker``) and the
    classes of ``src`` (module, class) that name it among their bases."""
    found: dict[str, list[tuple[str, str]]] = {}
    for path in SOURCES:
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
                    found.setdefault(name, []).append((module_name(path), node.name))
    return found


def test_the_rq_worker_is_the_seams_one_worker_class_and_at_most_one_subclass_of_it() -> None:
    # Every override of RQ's worker in one class of the seam; what the jobs are, in at most one
    # subclass of it that overrides no RQ method (tests/worker/test_rq_compat.py checks that on
    # each RQ): no tower of classes sharing private state across files.
    bases = classes_by_base()
    assert bases.get("SimpleWorker", []) + bases.get("Worker", []) == [SEAM_WORKER]
    subclasses = bases.get(SEAM_WORKER[1], [])
    assert len(subclasses) <= 1, subclasses
    for _, name in subclasses:
        assert not bases.get(name), f"{name} is subclassed in turn: {bases.get(name)}"


def test_only_entry_points_read_the_environment() -> None:
    reading = set()
    for path in SOURCES:
        for node in ast.walk(tree(path)):
            if (isinstance(node, ast.Attribute) and node.attr in {"environ", "getenv", "environb"}) or (
                    isinstance(node, ast.ImportFrom) and node.module == "os"
                    and {a.name for a in node.names} & {"environ", "getenv", "environb"}):
                name = module_name(path)
                reading.add("sessionfork.cli" if name.startswith("sessionfork.cli") else name)
    assert reading <= ENVIRON_MODULES


@pytest.mark.parametrize("path", SOURCES, ids=module_name)
def test_imports_go_down_the_layers(path: Path) -> None:
    own = layer(module_name(path))
    if own is None:
        return
    for name in imported(path):
        if name.startswith("sessionfork."):
            target = layer(name)
            assert target is None or target <= own, f"{module_name(path)} imports {name}"
            here, there = side(module_name(path)), side(name)
            assert not (here and there and here != there), f"{module_name(path)} imports the other side's {name}"


def test_imports_of_sibling_modules_are_seen() -> None:
    """The cycle test below sees ``from ..core import errors`` as an import of ``core.errors``."""
    assert {"sessionfork.core.errors", "sessionfork.core.forks", "sessionfork.protocol.requests"} <= \
        imported(PACKAGE / "worker" / "service.py")


def test_no_import_cycle() -> None:
    graph = {module_name(p): {m for m in imported(p) if m.startswith("sessionfork")} for p in SOURCES}
    seen: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        if seen.get(node) == 1:
            raise AssertionError("import cycle: " + " -> ".join([*path, node]))
        if seen.get(node) == 2 or node not in graph:
            return
        seen[node] = 1
        for nxt in sorted(graph[node]):
            # A package's __init__ importing its own submodules is how a package is put together.
            if not nxt.startswith(node + ".") or node == "sessionfork":
                visit(nxt, [*path, node])
        seen[node] = 2

    for name in sorted(graph):
        visit(name, [])


def test_key_names_are_built_only_in_keys() -> None:
    for path in SOURCES:
        if path.stem in {"keys", "acl"}:  # acl writes key *patterns* from keys' constants
            continue
        text = path.read_text()
        assert 'f"sf:' not in text and "'sf:" not in text and '"sf:' not in text, path.name


# The fork path, each step in one place: the queue's sides enter the session core through
# ``core/forks.py`` only, one entry per step, and never calls the registry's fork steps itself.
FORK_STEPS = {"take_snapshot", "prepare_fork", "look_ops", "plan_of", "create_children", "create_child",
              "confirm_replays", "read_snapshot", "child_header", "is_cluster"}
FORK_ENTRIES = {"check", "source_ops", "plan", "create", "send_many", "created_by"}
QUEUE_SOURCES = [p for p in SOURCES
                 if module_name(p).startswith(("sessionfork.protocol", "sessionfork.clients", "sessionfork.worker"))]


@pytest.mark.parametrize("path", QUEUE_SOURCES, ids=module_name)
def test_the_queue_side_never_calls_the_registrys_fork_steps(path: Path) -> None:
    used = {node.attr for node in ast.walk(tree(path)) if isinstance(node, ast.Attribute)}
    assert not used & FORK_STEPS, f"{module_name(path)} calls the registry's fork steps: go through core.forks"


@pytest.mark.parametrize("path", QUEUE_SOURCES, ids=module_name)
def test_the_queue_side_enters_the_fork_core_by_its_step_entries(path: Path) -> None:
    called = {node.attr for node in ast.walk(tree(path)) if isinstance(node, ast.Attribute)
              and isinstance(node.value, ast.Name) and node.value.id == "forks"}
    assert called <= FORK_ENTRIES


def test_the_service_runs_a_request_through_one_entry_per_step() -> None:
    service = PACKAGE / "worker" / "service.py"
    called = [node.attr for node in ast.walk(tree(service)) if isinstance(node, ast.Attribute)
              and isinstance(node.value, ast.Name) and node.value.id == "forks"]
    # Each once: check, source ops, plan, the children (of a request; of a batch's), what a failure left.
    assert sorted(called) == sorted(FORK_ENTRIES)


# Strings that name a module of another layer: none, but RQ's job function path, which producers
# write into RQ's job hash (RQ imports it in the worker; the protocol only spells the name).
NAMED_BY_STRING = {("sessionfork.protocol.rq_layout", "sessionfork.jobs")}


def layer_of(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def named_elsewhere(source: str, name: str) -> list[str]:
    """The strings of ``source`` (module ``name``'s code, docstrings and logger names left out)
    that name a module of another layer than ``name``'s: imports the import graph does not show."""
    module = ast.parse(source)
    docstrings = {id(n.body[0].value) for n in ast.walk(module)
                  if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    logger_names = {id(arg) for n in ast.walk(module) if isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Attribute) and n.func.attr == "getLogger" for arg in n.args}
    return [n.value for n in ast.walk(module) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings and id(n) not in logger_names and n.value in MODULES
            and "." in n.value and layer_of(n.value) != layer_of(name) and (name, n.value) not in NAMED_BY_STRING]


@pytest.mark.parametrize("path", SOURCES, ids=module_name)
def test_no_module_names_another_layers_module_by_string(path: Path) -> None:
    # A script's package, a job function, an importlib call: a module may spell only its own
    # layer's modules (logger names are names, not imports).
    assert named_elsewhere(path.read_text(), module_name(path)) == []


def test_a_module_named_by_a_string_of_another_layer_is_seen() -> None:
    # What core/lua.py once did: the worker's and the protocol's script packages, named by string.
    source = '"""Doc: sessionfork.worker."""\nimport logging\nlog = logging.getLogger("sessionfork.worker")\n' \
             '_WORKER = "sessionfork.worker"\nOWN = "sessionfork.core.keys"\n'
    assert named_elsewhere(source, "sessionfork.core.lua") == ["sessionfork.worker"]
