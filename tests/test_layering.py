"""The package layers hold (issue 15): no import cycle, no upward import, no Kafka in the algorithm.

Every module of ``cbgp/``, ``services/`` and ``spark/`` is read with :mod:`ast`; every ``import`` counts, at
the top of a module and inside functions alike (a function-level import that closes a cycle is still a cycle:
it only moves the failure from import time to call time).  No module is imported, so the test needs neither
a broker nor Spark.

Two graphs are built from the same imports:

- **direct**: module -> the product module it names (``from a.b import c`` names ``a.b.c`` when that is a
  module, else ``a.b``).  Cycles are looked for here: a submodule naming its own package's ``__init__`` while
  the ``__init__`` re-exports it is how packages are built, so parent packages are not added.
- **executed**: direct, plus the ``__init__`` of every package above each named module, since Python runs
  those first.  What a Kafka-free module drags in is computed here: ``from services.kafka.topics import X``
  runs ``services/kafka/__init__.py``, which imports confluent_kafka.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("cbgp", "services", "spark")
KAFKA_SIDE = ("confluent_kafka", "faust", "aiokafka", "pyspark")
# Modules documented as holding no Kafka code (their docstrings say so); cbgp/ as a whole is added below.
KAFKA_FREE = ("services.worker_core", "services.release", "services.release_operators", "services.records",
              "services.instruments",
              "services.idempotence", "services.topology", "services.codec", "services.queries", "services.registry",
              "services.worker_probes", "services.state", "services.background_core")

# The layers, lowest first: a module may import its own layer and those below, never one above.
LAYERS = (
    ("algorithm", ("cbgp",)),
    ("Kafka-free transforms, records and wire format",
     ("services.records", "services.instruments", "services.idempotence", "services.topology", "services.codec",
      "services.queries", "services.registry", "services.worker_probes", "services.worker_core",
      "services.release", "services.release_operators", "services.answers_checkpoint", "services.state",
      "services.background_core")),
    ("Kafka plumbing", ("services.kafka", "services.metrics")),
    ("service runtime", ("services.runtime", "services.runner", "services.state.recovery")),
    ("services and the Spark job", ("services.ingest", "services.ingest_core", "services.worker", "services.answers",
                                    "services.answers_inputs",
                                    "services.background", "services.registry_faust",
                                    "services.usercli", "services.gateway", "spark")),
    ("command line and local runner", ("services.cli", "services.run", "services.supervise", "services.demo")),
)


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
    assert {"cbgp.engine", "services.worker_core", "services.runtime", "spark.job"} <= set(modules)
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
              for t in sorted(direct[m]) if t in ("services.runtime", "services.cli", "services.run")]
    assert not upward, "\n  ".join(upward)


def _kafka_free_modules() -> list[str]:
    modules = product_modules()
    return sorted({m for m in modules if m.split(".")[0] == "cbgp"} | set(KAFKA_FREE))


@pytest.mark.parametrize("module", _kafka_free_modules())
def test_kafka_free_modules_import_no_kafka_or_spark_client(module: str) -> None:
    problems = kafka_side_imports(module)
    assert not problems, f"{module} is documented as Kafka-free, but:\n  " + "\n  ".join(problems)


def test_the_documented_kafka_free_modules_exist() -> None:
    assert set(KAFKA_FREE) <= set(product_modules())


def test_the_checks_see_what_they_look_for() -> None:
    """The graph sees function-level imports and package ``__init__``s (else the tests above prove nothing)."""
    direct, executed, external = graphs()
    assert "spark.job" in direct["services.cli"] or any("spark.job" in direct[m] for m in direct)
    assert "confluent_kafka" in external["services.kafka.client"]
    assert "services.kafka" in executed["services.kafka.topics"] or "services.kafka.topics" not in direct
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


# One of each (issue 15 item 4): the names below are defined (assigned or def'd) in exactly one module.
ONE_HOME = {
    "SNAPSHOT_INDEX_BASE": "services.idempotence", "WHOLE_SOURCE_PARTITION": "services.idempotence",
    "WINDOW_SOURCE_PARTITION": "services.idempotence", "ASSEMBLY_SOURCE_BASE": "services.idempotence",
    "ORDERED_SOURCE_BELOW": "services.idempotence", "WHOLE_QUERY_PART": "services.records",
    "ORIGIN_HEADER": "services.records", "query_partition": "services.records", "dead_letter": "services.records",
    # One representation of a change (issue 15 item 1) and the one routing function, in the algorithm package.
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
            if module != ONE_HOME[name] and not (module == "services.ingest_core" and name == "routes"):
                misplaced.append(f"{module} defines {name} (its home is {ONE_HOME[name]})")
        if module != "services.records" and ('"DeadLetter", {' in text or '"DeadLetter", record' in text):
            misplaced.append(f"{module} builds a DeadLetter record itself (use services.records.dead_letter)")
    assert not misplaced, "\n  ".join(misplaced)


# No module over 600 lines (issue 15): a module that long mixes jobs, so split it by job (re-exporting from the
# old address keeps its importers unchanged).  The allow-list holds the modules still over the limit, each with
# the reason; an entry whose module has come under the limit fails too, so the list shows exactly what is left.
MAX_MODULE_LINES = 600
OVER_THE_LIMIT: dict[str, str] = {
    # empty: every module is under the limit (the last, cbgp.distributed, was split in c57229d)
}


def _module_lines() -> dict[str, int]:
    return {module: len(path.read_text().splitlines()) for module, path in product_modules().items()}


def test_no_product_module_is_over_600_lines() -> None:
    over = sorted(f"{module} ({lines} lines)" for module, lines in _module_lines().items()
                  if lines > MAX_MODULE_LINES and module not in OVER_THE_LIMIT)
    assert not over, (f"modules over {MAX_MODULE_LINES} lines (split them by job, or add them to OVER_THE_LIMIT "
                      "with the reason):\n  " + "\n  ".join(over))


def test_the_size_allow_list_names_only_modules_still_over_the_limit() -> None:
    lines = _module_lines()
    stale = sorted(f"{module} ({lines.get(module, 0)} lines)" for module in OVER_THE_LIMIT
                   if lines.get(module, 0) <= MAX_MODULE_LINES)
    assert not stale, "no longer over the limit: remove from OVER_THE_LIMIT:\n  " + "\n  ".join(stale)


# Tests mirror the tree (issue 15): a test module sits in the folder of what it tests -- tests/cbgp/... for the
# algorithm, tests/services/... (kafka, gateway, usercli) for the services, tests/spark, tests/helm, tests/docker,
# tests/schemas for the design card's folders -- or in tests/fleet when it runs the fleet end to end.  Shared
# helpers (fixtures, oracles, fleet support) stay at the top of tests/, with this test, which covers every package.
TEST_HOMES = {"cbgp", "services", "spark", "helm", "docker", "schemas", "fleet"}


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
        elif home not in ("fleet", "helm", "docker", "schemas") and not (REPO.joinpath(*parts[:-1])).is_dir():
            misplaced.append(f"{path.relative_to(REPO)}: {'/'.join(parts[:-1])} is not a package of the product")
    assert not misplaced, "\n  ".join(misplaced)
