"""The package layers hold: no import cycle, no upward import, no Kafka in the algorithm or the service cores,
no private names or re-export shims across modules, and no module over 800 lines.

Every module of ``cbgp/``, ``services/`` and ``spark/`` is read with :mod:`ast`; every ``import`` counts, at
the top of a module and inside functions alike (a function-level import that closes a cycle is still a cycle).
No module is imported, so the test needs neither a broker nor Spark.

Two graphs are built from the same imports: **direct** (module -> the product module it names; cycles are looked
for here) and **executed** (direct, plus the ``__init__`` of every package above each named module, since Python
runs those first; what a Kafka-free module drags in is computed here).
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("cbgp", "services", "spark")
KAFKA_SIDE = ("confluent_kafka", "faust", "aiokafka", "pyspark")

# One folder per service: a Kafka-free core (``core.py`` and the modules beside it) and a Kafka side (these
# basenames: the loop and wiring, and the gateway's topic and HTTP sides).
SERVICE_FOLDERS = ("ingest", "worker", "answers", "registry", "background", "gateway")
SERVICE_SIDE = ("service", "side_inputs", "kafka_io", "app", "server", "command")


def _service_modules(kafka_side: bool) -> tuple[str, ...]:
    found = []
    for folder in SERVICE_FOLDERS:
        for path in sorted((REPO / "services" / folder).glob("*.py")):
            if path.stem != "__init__" and (path.stem in SERVICE_SIDE) == kafka_side:
                found.append(f"services.{folder}.{path.stem}")
    return tuple(found)


CORES = _service_modules(kafka_side=False)
# Kafka-free: the algorithm (added below), what travels between services, state, metric objects, service cores.
KAFKA_FREE = ("services.wire", "services.codec", "services.state", "services.metrics.instruments") + CORES

# The layers, lowest first: a module may import its own layer and those below, never one above.
LAYERS = (
    ("algorithm", ("cbgp",)),
    ("records, wire format, state and metric objects", ("services.wire", "services.codec", "services.state",
                                                        "services.metrics.instruments")),
    ("service cores", CORES),
    ("Kafka plumbing", ("services.kafka", "services.metrics")),
    ("service runtime and client", ("services.runtime", "services.client")),
    ("services and the Spark job", _service_modules(kafka_side=True) + ("spark",)),
    ("commands", ("services.commands",)),
)
# Packages whose __init__ is their public API (names listed in __all__); every other __init__ holds a docstring.
API_PACKAGES = ("services.codec", "cbgp.algebra", "cbgp.background")
MAX_MODULE_LINES = 800


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@lru_cache(maxsize=1)
def product_modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _imported_names(name: str, path: Path) -> set[str]:
    """Absolute names of everything ``path`` imports, anywhere in it (``from a import b`` gives a.b and a)."""
    is_package = path.name == "__init__.py"
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _resolve(imported: str, modules: dict[str, Path]) -> str | None:
    """The product module an imported name refers to: itself if a module, else its longest module prefix."""
    parts = imported.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


@lru_cache(maxsize=1)
def graphs() -> tuple[dict[str, set[str]], dict[str, set[str]], dict[str, set[str]]]:
    """(direct product edges, executed product edges, third-party top-level packages imported) per module."""
    modules = product_modules()
    direct: dict[str, set[str]] = {}
    executed: dict[str, set[str]] = {}
    external: dict[str, set[str]] = {}
    for name, path in modules.items():
        direct[name], executed[name], external[name] = set(), set(), set()
        imported = _imported_names(name, path)
        for full in imported:
            target = _resolve(full, modules)
            if target is None:
                if full.split(".")[0] not in PACKAGES:
                    external[name].add(full.split(".")[0])
                continue
            # `from a.b import c`: both "a.b" and "a.b.c" are in `imported`; keep the most specific module
            if target == name:
                continue
            if any(other != full and other.startswith(full + ".") and _resolve(other, modules) not in (None, target)
                   for other in imported):
                continue
            direct[name].add(target)
            executed[name].add(target)
            parts = target.split(".")
            executed[name].update(p for p in (".".join(parts[:i]) for i in range(1, len(parts)))
                                  if p in modules and p != name)
    return direct, executed, external


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def _path(edges: dict[str, set[str]], start: str, goal: str) -> list[str]:
    """One import chain start -> ... -> goal (breadth first), for a readable failure."""
    previous: dict[str, str | None] = {start: None}
    queue = [start]
    while queue:
        node = queue.pop(0)
        if node == goal:
            chain = [node]
            while previous[chain[-1]] is not None:
                chain.append(previous[chain[-1]])  # type: ignore[arg-type]
            return chain[::-1]
        for nxt in sorted(edges.get(node, ())):
            if nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    return []


def kafka_side_imports(module: str) -> list[str]:
    """Each Kafka-side package ``module`` imports, directly or through product modules, with the chain."""
    _direct, executed, external = graphs()
    problems = []
    reachable = {module} | {m for m in executed if _path(executed, module, m)}
    for via in sorted(reachable):
        for package in sorted(external[via] & set(KAFKA_SIDE)):
            problems.append(f"{' -> '.join(_path(executed, module, via))} imports {package}")
    return problems


def test_every_product_module_is_read() -> None:
    modules = product_modules()
    assert {"cbgp.engine.engine", "services.worker.core", "services.runtime.life", "spark.job"} <= set(modules)
    assert "services.kafka" in modules and "services.kafka.client" in modules


def test_no_import_cycle_among_the_product_modules() -> None:
    direct, _executed, _external = graphs()
    cycles = _cycles(direct)
    described = []
    for component in cycles:
        inside = {m: direct[m] & set(component) for m in component}
        first = component[0]
        back = next(m for m in component if first in inside[m])
        described.append(" -> ".join(_path(inside, first, back) + [first]))
    assert not cycles, "import cycles (function-level imports count):\n  " + "\n  ".join(
        f"{c}: e.g. {d}" for c, d in zip(cycles, described))


def layer_of(module: str) -> int:
    """The index in LAYERS of ``module`` (by its longest listed prefix)."""
    best, rank = -1, None
    for index, (_name, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), index
    if rank is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in tests/test_layering.py")
    return rank


def test_every_module_is_in_a_layer_and_imports_nothing_above_it() -> None:
    direct, _executed, _external = graphs()
    upward = []
    for module in sorted(m for m in direct if m not in PACKAGES):
        for target in sorted(t for t in direct[module] if t not in PACKAGES):
            if layer_of(target) > layer_of(module):
                upward.append(f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} "
                              f"({LAYERS[layer_of(target)][0]})")
    assert not upward, "upward imports:\n  " + "\n  ".join(upward)


def test_the_algorithm_package_imports_nothing_above_it() -> None:
    direct, _executed, _external = graphs()
    upward = [f"{m} imports {t}" for m in sorted(direct) if m.split(".")[0] == "cbgp"
              for t in sorted(direct[m]) if t.split(".")[0] != "cbgp"]
    assert not upward, "cbgp/ is the algorithm: it must not import services/ or spark/:\n  " + "\n  ".join(upward)


def test_spark_does_not_import_the_kafka_services_runtime() -> None:
    direct, _executed, _external = graphs()
    upward = [f"{m} imports {t}" for m in sorted(direct) if m.startswith("spark")
              for t in sorted(direct[m]) if t in ("services.runtime.life", "services.commands.main", "services.commands.run")]
    assert not upward, "\n  ".join(upward)


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _kafka_free_modules() -> list[str]:
    return sorted(m for m in product_modules() if m.split(".")[0] == "cbgp" or _within(m, KAFKA_FREE))


@pytest.mark.parametrize("module", _kafka_free_modules())
def test_kafka_free_modules_import_no_kafka_or_spark_client(module: str) -> None:
    problems = kafka_side_imports(module)
    assert not problems, f"{module} is documented as Kafka-free, but:\n  " + "\n  ".join(problems)


def test_the_documented_kafka_free_modules_exist() -> None:
    assert set(KAFKA_FREE) <= set(product_modules())
    assert {"services.ingest.core", "services.worker.core", "services.answers.core", "services.registry.core",
            "services.background.core", "services.gateway.core"} <= set(CORES)


def test_the_checks_see_what_they_look_for() -> None:
    """The graph sees function-level imports and package ``__init__``s (else the tests above prove nothing)."""
    direct, executed, external = graphs()
    assert "spark.job" in direct["services.commands.main"] or any("spark.job" in direct[m] for m in direct)
    assert "confluent_kafka" in external["services.kafka.client"]
    assert "services.kafka" in executed["services.kafka.topics"] or "services.kafka.topics" not in direct
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


# One of each: the names below are defined (assigned or def'd) in exactly one module.
ONE_HOME = {
    "SNAPSHOT_INDEX_BASE": "services.wire.idempotence", "WHOLE_SOURCE_PARTITION": "services.wire.idempotence",
    "WINDOW_SOURCE_PARTITION": "services.wire.idempotence", "ASSEMBLY_SOURCE_BASE": "services.wire.idempotence",
    "ORDERED_SOURCE_BELOW": "services.wire.idempotence", "WHOLE_QUERY_PART": "services.wire.records",
    "ORIGIN_HEADER": "services.wire.records", "query_partition": "services.wire.records", "dead_letter": "services.wire.records",
    # One representation of a change and the one routing function, in the algorithm package.
    "Change": "cbgp.change", "change_of": "cbgp.change", "routes": "cbgp.change", "partition_of": "cbgp.change", "ROLE_SUBJECT": "cbgp.change",
    "ROLE_OBJECT": "cbgp.change", "ROLE_BOTH": "cbgp.change",
}


def _definitions(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_keys_routing_and_dead_letters_have_one_home() -> None:
    """The idempotence-key ranges, the routing function and the dead-letter builder are each defined once
    (IngestProcessor.routes delegates to cbgp.change.routes), and only the builder encodes a DeadLetter."""
    misplaced = []
    for module, path in product_modules().items():
        text = path.read_text()
        for name in sorted(_definitions(path) & set(ONE_HOME)):
            if module != ONE_HOME[name] and not (module == "services.ingest.core" and name == "routes"):
                misplaced.append(f"{module} defines {name} (its home is {ONE_HOME[name]})")
        if module != "services.wire.records" and ('"DeadLetter", {' in text or '"DeadLetter", record' in text):
            misplaced.append(f"{module} builds a DeadLetter record itself (use services.wire.records.dead_letter)")
    assert not misplaced, "\n  ".join(misplaced)


# Tests mirror the tree: a test module sits in the folder of what it tests -- tests/cbgp/... for the
# algorithm, tests/services/... (kafka, gateway, usercli) for the services, tests/spark, tests/helm, tests/docker,
# tests/schemas for the design card's folders -- or in tests/fleet when it runs the fleet end to end.  Shared
# helpers (fixtures, oracles, fleet support) stay at the top of tests/, with this test, which covers every package.
TEST_HOMES = {"cbgp", "services", "spark", "helm", "docker", "schemas", "fleet", "docs"}


def test_tests_mirror_the_package_tree() -> None:
    misplaced = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        parts = path.relative_to(REPO / "tests").parts
        if len(parts) == 1:
            if path.name != "test_layering.py":
                misplaced.append(f"tests/{path.name}: at the top of tests/, move it to the folder of what it tests")
            continue
        home = parts[0]
        if home not in TEST_HOMES:
            misplaced.append(f"{path.relative_to(REPO)}: tests/{home} mirrors no folder of the product")
        elif home not in ("fleet", "helm", "docker", "schemas", "docs") and not (REPO.joinpath(*parts[:-1])).is_dir():
            misplaced.append(f"{path.relative_to(REPO)}: {'/'.join(parts[:-1])} is not a package of the product")
    assert not misplaced, "\n  ".join(misplaced)


def test_services_are_folders_and_every_service_has_its_core_and_service() -> None:
    loose = sorted(p.name for p in (REPO / "services").glob("*.py") if p.name != "__init__.py")
    assert not loose, f"services/ holds folders only (one per service or plumbing concept): {loose}"
    missing = [f"services/{folder}/{name}.py" for folder in SERVICE_FOLDERS for name in ("core", "service")
               if not (REPO / "services" / folder / f"{name}.py").exists()]
    assert not missing, f"every service folder has a Kafka-free core.py and a service.py: {missing}"


def test_service_cores_and_kafka_free_layers_import_nothing_of_kafka() -> None:
    """A core takes topic names and positions as values: it imports nothing of ``services.kafka`` (not even its
    settings), so it is tested as plain calls."""
    direct, _executed, _external = graphs()
    found = [f"{m} imports {t}" for m in _kafka_free_modules() for t in sorted(direct[m])
             if _within(t, ("services.kafka",))]
    assert not found, "\n  ".join(found)


def test_the_kafka_package_imports_nothing_of_the_services() -> None:
    direct, _executed, _external = graphs()
    allowed = ("services.kafka", "services.metrics", "services.wire", "services.codec")
    found = [f"{m} imports {t}" for m in sorted(direct) if _within(m, ("services.kafka",))
             for t in sorted(direct[m]) if t != "services" and not _within(t, allowed)]
    assert not found, "services/kafka wraps the client and nothing else:\n  " + "\n  ".join(found)


def _private_imports(name: str, path: Path, modules: dict[str, Path]) -> list[str]:
    """``from a.b import _c`` of a product module, and ``module._c`` through a name bound to a product module."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and _resolve(node.module or "", modules):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in modules:
                    bound[alias.asname or alias.name] = full
                elif alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{name} imports {node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules and alias.asname:
                    bound[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{name} uses {bound[node.value.id]}.{node.attr}")
    return found


def test_no_private_name_is_used_across_modules() -> None:
    """A name used elsewhere is public where it lives (tests count too: they are callers like any other)."""
    modules = product_modules()
    found = []
    for name, path in modules.items():
        found += _private_imports(name, path, modules)
    for path in sorted((REPO / "tests").rglob("*.py")) + sorted((REPO / "bench").glob("*.py")):
        found += _private_imports(str(path.relative_to(REPO)), path, modules)
    assert not found, "\n  ".join(sorted(set(found)))


def _unused_imports(path: Path, api: bool = False) -> list[str]:
    """Product names ``path`` imports and never uses (in an API package's ``__init__``, those not in ``__all__``)."""
    tree = ast.parse(path.read_text(), str(path))
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used |= {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    exported: set[str] = set()
    for node in tree.body if api else ():
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            exported = {e.value for e in node.value.elts if isinstance(e, ast.Constant)}  # type: ignore[attr-defined]
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
            names += [a.asname or a.name for a in node.names]
    return [n for n in names if n not in used and n not in exported and n != "*"]


def test_no_module_re_exports_what_it_imports() -> None:
    """No shims: a module imports what it uses.  Only the packages named in API_PACKAGES have an ``__init__`` that
    gathers their public names (in ``__all__``); every other ``__init__`` holds a docstring and nothing else."""
    problems = []
    for name, path in product_modules().items():
        text = path.read_text()
        if "noqa: F401" in text:
            problems.append(f"{name}: 'noqa: F401' (an import kept for its importers)")
        unused = _unused_imports(path, api=name in API_PACKAGES)
        if unused:
            problems.append(f"{name} imports names it does not use: {', '.join(unused)}")
        if path.name == "__init__.py" and name not in API_PACKAGES:
            body = ast.parse(text).body
            if any(not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)) for node in body):
                problems.append(f"{name}/__init__.py holds more than its docstring")
    assert not problems, "\n  ".join(problems)


def test_no_product_module_is_over_800_lines() -> None:
    """A generous guard, a smell detector only: a module's size follows its concept."""
    over = sorted(f"{m} ({n} lines)" for m, path in product_modules().items()
                  if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES)
    assert not over, "\n  ".join(over)


# Basenames that are the same role in parallel folders (one per service, or the package marker).
SHARED_BASENAMES = {"__init__", "core", "service", "checkpoint", "kafka_io"}


def test_no_two_modules_share_a_basename_unless_they_are_the_same_role() -> None:
    seen: dict[str, list[str]] = {}
    for name, path in product_modules().items():
        seen.setdefault(path.stem, []).append(name)
    clashes = sorted(f"{stem}: {', '.join(names)}" for stem, names in seen.items()
                     if len(names) > 1 and stem not in SHARED_BASENAMES)
    assert not clashes, "\n  ".join(clashes)


def _defined_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def test_every_name_is_imported_from_where_it_is_defined() -> None:
    """``from a import X`` names the module that defines X (or a package's API, or a submodule): nothing passes
    through a module that only imports it, so moving a name breaks its importers loudly instead of a shim."""
    modules = product_modules()
    defined = {name: _defined_names(path) for name, path in modules.items()}
    found = []
    paths = list(modules.items()) + [(str(p.relative_to(REPO)), p) for p in sorted((REPO / "tests").rglob("*.py"))]
    paths += [(str(p.relative_to(REPO)), p) for p in sorted((REPO / "bench").glob("*.py"))]
    for name, path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules):
                continue
            if node.module in API_PACKAGES:
                continue
            for alias in node.names:
                if f"{node.module}.{alias.name}" in modules or alias.name in defined[node.module]:
                    continue
                found.append(f"{name} imports {alias.name} from {node.module}, which does not define it")
    assert not found, "\n  ".join(sorted(set(found)))


def test_no_issue_or_session_numbers_in_the_product_or_its_docs() -> None:
    """History belongs to git: no "issue N" or "session N" in the product, the README or docs/."""
    import re

    pattern = re.compile(r"\b(issue|session)s? #?\d+", re.IGNORECASE)
    paths = [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")]
    paths += [REPO / "README.md"] + sorted((REPO / "docs").rglob("*.md"))
    found = [f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}"
             for path in paths for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, f"{len(found)} lines:\n  " + "\n  ".join(found[:40])


def test_ruff_finds_nothing() -> None:
    """The linter (pinned in requirements-dev.lock, configured in pyproject.toml) passes on the whole repository:
    unused imports, undefined names and the like fail the build, not a later reader."""
    import subprocess
    import sys

    ruff = Path(sys.executable).with_name("ruff")
    result = subprocess.run([str(ruff), "check", "--no-cache", "--quiet", str(REPO)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-1000:]
