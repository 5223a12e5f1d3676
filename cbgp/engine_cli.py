"""Engine commands of the `cbgp` CLI: `replay` and `explain` (no Kafka here).

How it works: docs/design/internals.md, cbgp.engine_cli.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable, TextIO

from cbgp.change import ROLE_BOTH, ROLE_OBJECT, ROLE_SUBJECT
from cbgp.engine.engine import EngineError
from cbgp.query.plan import BY_CENTRE, SINGLE_OWNER, decompose
from cbgp.query.sparql import QueryError
from cbgp.terms import DEFAULT_GRAPH_ID, to_sparql_json


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise CliError(f"{path} is not UTF-8 text (byte {exc.start})") from None


def _parse_rspql_file(path: str, views: list | None = None):  # noqa: ANN202
    """``(ParsedQuery or OperatorQuerySpec of the plain SPARQL, WindowSpec or None)`` of a .rq file, RSP-QL
    windows allowed (the Spark job evaluates them).  ``views``: SERVICE clauses are read as the fleet reads
    them, as their view graphs (``cbgp.background.view_graphs``), and their views appended here; without it a
    SERVICE is refused (nothing here calls an endpoint)."""
    from cbgp.algebra import analyse
    from cbgp.background.service_clause import ServiceError
    from cbgp.background.view_graphs import has_service, rewrite_services
    from cbgp.windows.windowed import WindowedQuery
    from cbgp.windows.rspql import parse_rspql

    text = _read_text(path)
    try:
        plain, window = parse_rspql(text)
        if has_service(plain):
            if views is None:
                from cbgp.query.sparql import find_keyword

                line, column = find_keyword(plain, "SERVICE")
                where = f":{line}:{column}" if line is not None else ""
                raise CliError(f"{path}{where}: SERVICE is not supported by `cbgp replay`, which has no endpoint: "
                               "register the query with the fleet (`cbgp background` keeps its data as a local view)")
            try:
                plain, found = rewrite_services(plain)
            except ServiceError as exc:
                raise CliError(f"{path}: SERVICE: {exc}") from None
            views.extend(found)
        query = analyse(plain)
        if window is not None:
            WindowedQuery(plain, window)  # what a window cannot run (a per-event window's limits)
        return query, window
    except QueryError as exc:  # WindowError included
        where = f":{exc.line}:{exc.column}" if exc.line is not None else ""
        raise CliError(f"{path}{where}: {exc.message}") from None


def _parse_query_file(path: str):  # noqa: ANN202
    query, window = _parse_rspql_file(path)
    if window is not None:
        raise CliError(f"{path}: the query declares an event-time window; replay evaluates a stream without "
                       "event times, so register windowed queries with the fleet (their Spark job)")
    return query


def _window_json(window) -> dict:  # noqa: ANN001
    return {"kind": window.kind, "range_ms": window.range_ms, "step_ms": window.step_ms,
            "lateness_ms": window.lateness_ms, "late": window.late_policy}


def _window_text(window) -> str:  # noqa: ANN001
    shape = f"{window.kind}, range {window.range_ms} ms" + \
        (f", step {window.step_ms} ms" if window.kind == "sliding" else "")
    late = "dropped" if window.late_policy == "drop" else "admitted"
    return (f"event-time window: {shape}, lateness {window.lateness_ms} ms, late updates {late}; evaluated by "
            "the fleet's Spark job over the window's content at each instant")


# File name endings `cbgp publish` and `cbgp replay` read a format from (besides cbgp.inputs.formats' own).
_UPDATE_SUFFIXES = (".ru", ".sparql-update")


def input_format(path: str) -> str:
    """The input format of ``path`` from its name, as ``cbgp publish`` tells it; CliError if it cannot."""
    from cbgp.inputs.formats import FORMATS, detect_format
    from cbgp.inputs.sparql_update import UPDATE_FORMAT

    if path.lower().endswith(_UPDATE_SUFFIXES):
        return UPDATE_FORMAT
    try:
        return detect_format(path)
    except ValueError:
        raise CliError(f"cannot tell the format of {path} from its name (.rdfp, .nt, .nq, .ttl, .jsonl, .ru): "
                       f"pass --format ({', '.join((*FORMATS, UPDATE_FORMAT))})") from None


def _update_items(path: str, text: str):  # noqa: ANN202
    """The quad changes of a SPARQL Update request applied to an empty store, as ingest emits them
    (deletions, then insertions), numbered 1, 2, ...; a failing request is a CliError."""
    import pyoxigraph as ox

    from cbgp.inputs.formats import Update
    from cbgp.inputs.sparql_update import UpdateExtractor, UpdateRequestError

    try:
        delta = UpdateExtractor(ox.Store()).apply(text)
    except UpdateRequestError as exc:
        raise CliError(f"{path}: the SPARQL Update request was rejected: {exc}") from None
    changes = [(-1, q) for q in delta.deleted] + [(1, q) for q in delta.inserted]
    for position, (op, (s, p, o, g)) in enumerate(changes, 1):
        yield Update(op, s, p, o, g, 0, position)


def _query_args(values: list[str]) -> list[tuple[str, str]]:
    pairs = []
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise CliError(f"--query expects NAME=FILE.rq, got {value!r}")
        pairs.append((name, path))
    duplicates = sorted(n for n, times in Counter(n for n, _ in pairs).items() if times > 1)
    if duplicates:
        raise CliError(f"query name(s) given twice: {', '.join(duplicates)}")
    return pairs


class _Progress:
    """Progress on stderr for long replays (only when stderr is a terminal or asked for)."""

    def __init__(self, enabled: bool, total_lines: int) -> None:
        self.enabled = enabled
        self.total = max(total_lines, 1)
        self.start = time.monotonic()
        self.last = self.start

    def tick(self, line: int, updates: int) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.last < 0.5:
            return
        self.last = now
        rate = updates / max(now - self.start, 1e-9)
        print(f"\rreplay: line {line}/{self.total} ({100 * line // self.total}%), {rate:,.0f} updates/s",
              end="", file=sys.stderr, flush=True)

    def done(self, updates: int, deltas: int) -> None:
        if self.enabled:
            elapsed = time.monotonic() - self.start
            print(f"\rreplay: {updates:,} updates, {deltas:,} deltas in {elapsed:.1f} s" + " " * 20,
                  file=sys.stderr, flush=True)


def replay(patch_path: str, queries: list[tuple[str, str]], out: TextIO, *, strict: bool = False,
           fmt: str | None = None, progress: bool = False, errors: TextIO = sys.stderr) -> dict[str, int]:
    """Replay a recorded stream through the engine; write deltas as JSON lines. Returns counters.

    ``fmt`` None: from the file name (``input_format``)."""
    from cbgp.inputs.formats import InputError, InputFormatError, parse_input
    from cbgp.inputs.sparql_update import UPDATE_FORMAT

    from cbgp.algebra import ContinuousEngine

    fmt = fmt or input_format(patch_path)
    engine = ContinuousEngine()
    initial = []
    for name, path in queries:
        initial.extend(engine.register(name, _parse_query_file(path)))
    text = _read_text(patch_path)
    dictionary = engine.dictionary
    encode = dictionary.encode
    json_terms: dict[int, dict] = {}

    def term_json(term_id: int) -> dict:
        found = json_terms.get(term_id)
        if found is None:
            found = json_terms[term_id] = to_sparql_json(dictionary.decode(term_id))
        return found

    columns = {name: engine.columns(name) for name, _ in queries}
    counters = {"updates": 0, "deltas": 0, "errors": 0}
    write = out.write
    for name, diff, row in initial:  # operator queries can answer before any update (COUNT 0, VALUES, ASK)
        binding = {var: term_json(value) for var, value in zip(columns[name], row) if value is not None}
        write(json.dumps({"query": name, "seq": 0, "sign": "+" if diff > 0 else "-", "binding": binding}) + "\n")
        counters["deltas"] += 1
    meter = _Progress(progress, text.count("\n") + 1)
    dumps = json.dumps
    try:
        items = _update_items(patch_path, text) if fmt == UPDATE_FORMAT else parse_input(text, fmt, strict=strict)
        for item in items:
            if isinstance(item, InputError):
                counters["errors"] += 1
                print(f"{patch_path}:{item.line}: {item.message}", file=errors)
                continue
            counters["updates"] += 1
            g = DEFAULT_GRAPH_ID if item.g is None else encode(item.g)
            deltas = engine.apply(item.op, encode(item.s), encode(item.p), encode(item.o), g)
            for name, diff, row in deltas:
                binding = {var: term_json(value) for var, value in zip(columns[name], row) if value is not None}
                write(dumps({"query": name, "seq": item.position, "sign": "+" if diff > 0 else "-",
                             "binding": binding}) + "\n")
            counters["deltas"] += len(deltas)
            for freed in engine.collect():  # (an aggregate's values no answer holds any more)
                json_terms.pop(freed, None)
            if progress and counters["updates"] % 4096 == 0:
                meter.tick(item.line, counters["updates"])
    except InputFormatError as exc:
        raise CliError(f"{patch_path}: {exc}") from None
    meter.done(counters["updates"], counters["deltas"])
    return counters


WINDOWED_PLACEMENT = "spark-window"
# Operator queries in the fleet: their BGP leaves by centre value when each leaf is, else one owner.
OPERATORS_WHERE = {
    BY_CENTRE: ("every BGP leaf's parts evaluated by centre value on updates.routed like a BGP query's, and every "
                "pattern leaf where its subject, its object or each node lives; the answers service releases "
                "their deltas in seq order and runs the operators over them; ASK answers ?ask true/false, "
                "CONSTRUCT ?subject ?predicate ?object (a derived stream: single-owner)"),
    SINGLE_OWNER: ("the whole query by its single owner (variable predicates in patterns that share no subject "
                   "or object, or a BGP leaf not placed by centre): the worker holding routed partition "
                   "query_partition(id) reads updates.encoded, "
                   "the total order, and runs the BGP leaves and the operators above them; answers numbered by "
                   "the answers service; ASK answers ?ask true/false, CONSTRUCT ?subject ?predicate ?object"),
    WINDOWED_PLACEMENT: ("the Spark job runs the BGP leaves and the operators over the window's content at each "
                         "instant; workers hold nothing; ASK answers ?ask true/false")}

# Where a routed shard evaluates a pattern leaf of a query placed by centre (cbgp.algebra.by_centre.pattern_role).
PATTERN_KEYS = {ROLE_SUBJECT: "subject", ROLE_OBJECT: "object", ROLE_BOTH: "node"}
PATTERN_WHERE = {
    "subject": "by centre: each change where the value of its subject lives (its updates.routed partition), with "
               "every other triple of a solution",
    "object": "by centre: each change where the value of its object lives (its updates.routed partition), with "
              "every other triple of a solution",
    "node": "by centre: each node counted where its value lives (its updates.routed partition), from the changes "
            "that touch it"}


def plan_json(query) -> dict:  # noqa: ANN001
    return decompose(query).to_json()


def explain(path: str, as_json: bool, out: TextIO) -> None:
    """How the query is evaluated (``--json``: as an object); a SERVICE clause as the background data the fleet
    keeps for it."""
    views: list = []
    _explain(path, as_json, out, views)
    if as_json:
        return
    for view in views:
        out.write(f"SERVICE <{view.endpoint}> on ?{view.key}: background data, kept as graph <{view.graph}> by "
                  "`cbgp background` (a local view refreshed within a budget; not windowed in a windowed query)\n")


def _write_json(data: dict, views: list, out: TextIO) -> None:
    if views:
        data["services"] = [{**view.to_json(), "kept_by": "cbgp background"} for view in views]
    json.dump(data, out, indent=2)
    out.write("\n")


def _explain(path: str, as_json: bool, out: TextIO, views: list) -> None:
    from cbgp.algebra import OperatorQuery, OperatorQuerySpec
    from cbgp.terms import TermDictionary

    query, window = _parse_rspql_file(path, views)
    if isinstance(query, OperatorQuerySpec):
        from cbgp.algebra.by_centre import leaf_parts

        operators = OperatorQuery(query, TermDictionary())
        parts = leaf_parts(query)
        placement = BY_CENTRE if parts is not None else SINGLE_OWNER
        if window is not None:
            placement = WINDOWED_PLACEMENT
        keyed = {part.leaf: PATTERN_KEYS[part.role] for part in parts or () if part.pattern is not None}
        if placement != BY_CENTRE:
            keyed = {}
        first = len(operators.engine_leaves)
        if as_json:
            data = {"form": query.form, "columns": list(query.columns), "placement": placement,
                    "where": OPERATORS_WHERE[placement], "operators": operators.root.explain(),
                    "bgps": [plan_json(leaf.query) for leaf in operators.engine_leaves],
                    "pattern_leaves": [{"leaf": leaf.describe(), "keyed_by": keyed.get(first + number)}
                                       for number, leaf in enumerate(operators.pattern_leaves)]}
            if window is not None:
                data["window"] = _window_json(window)
            _write_json(data, views, out)
        elif window is not None:
            out.write(_window_text(window) + "\n" + operators.explain() + "\n")
            out.write(f"placement in the fleet: {WINDOWED_PLACEMENT} ({OPERATORS_WHERE[placement]})\n")
        else:
            out.write(operators.explain() + "\n")
            for number, leaf in enumerate(operators.engine_leaves):
                text = decompose(leaf.query).explain()
                if placement == SINGLE_OWNER and "placement in the fleet:" in text:
                    text = text[:text.index("placement in the fleet:")].rstrip()  # the query's owner holds it
                else:
                    text = text.replace("placement in the fleet:", "this leaf in the fleet:")
                pushed = sorted(leaf.pushed)
                if pushed:  # (by centre too: the shards keep the changes it rejects out of their state)
                    text += "\nFILTER pushed into pattern(s) " + " ".join(f"t{i}" for i in pushed)
                out.write(f"BGP leaf{number}: " + text + "\n")
            for number, leaf in enumerate(operators.pattern_leaves):
                if first + number in keyed:
                    out.write(f"pattern leaf {leaf.label}: {PATTERN_WHERE[keyed[first + number]]}\n")
            out.write(f"placement in the fleet: {placement} ({OPERATORS_WHERE[placement]})\n")
            closures = [op for op in operators.root.walk() if op.name == "Closure"]
            if closures:
                keeper = "the answers service" if placement == BY_CENTRE else "the query's owner"
                for closure in closures:
                    out.write(f"property path {closure.label}: its closure kept by {keeper}, "
                              f"{closure.mode()}, at most CBGP_MAX_PATH_PAIRS pairs\n")
        return
    plan = decompose(query)
    if as_json:
        data = plan.to_json()
        if window is not None:
            data["window"] = _window_json(window)
            data["placement"] = WINDOWED_PLACEMENT  # the Spark job holds the window, not the workers
            for part in data["parts"]:
                part["placement"] = WINDOWED_PLACEMENT
        _write_json(data, views, out)
    elif window is not None:
        text = plan.explain()
        text = text[:text.index("placement in the fleet:")] + f"placement in the fleet: {WINDOWED_PLACEMENT} " \
            "(the Spark job evaluates the window's content; workers hold nothing)"
        out.write(_window_text(window) + "\n" + text + "\n")
    else:
        out.write(plan.explain() + "\n")


def add_engine_commands(commands: argparse._SubParsersAction) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Register `replay` and `explain`; return their handlers by command name."""
    p = commands.add_parser("replay", help="replay a recorded update stream and print delta answers as JSON lines")
    p.add_argument("--patch", required=True, metavar="UPDATES",
                   help="updates file: RDF Patch, N-Triples, N-Quads, Turtle, JSON lines or SPARQL Update")
    p.add_argument("--query", action="append", required=True, metavar="NAME=FILE.rq", help="a query (repeatable)")
    p.add_argument("--out", help="write deltas here instead of standard output")
    p.add_argument("--format", default=None,
                   choices=["patch", "ntriples", "nquads", "turtle", "jsonl", "sparql-update"],
                   help="format of the updates file (default: from its name, as publish: .rdfp .nt .nq .ttl "
                        ".jsonl .ru)")
    p.add_argument("--strict", action="store_true", help="stop at the first malformed line")
    p.add_argument("--progress", action="store_true", help="show progress on stderr (default: when it is a terminal)")

    e = commands.add_parser("explain", help="show how a query is decomposed and evaluated")
    e.add_argument("query", help="a .rq file")
    e.add_argument("--json", action="store_true", help="machine-readable output")

    def run_replay(args: argparse.Namespace) -> int:
        queries = _query_args(args.query)
        fmt = args.format or input_format(args.patch)  # before --out is created
        progress = args.progress or sys.stderr.isatty()
        if args.out:
            with open(args.out, "w", encoding="utf-8") as out:
                counters = replay(args.patch, queries, out, strict=args.strict, fmt=fmt, progress=progress)
        else:
            counters = replay(args.patch, queries, sys.stdout, strict=args.strict, fmt=fmt,
                              progress=progress)
        if counters["errors"]:
            print(f"cbgp replay: {counters['errors']} malformed line(s) skipped (see above)", file=sys.stderr)
        return 0

    def run_explain(args: argparse.Namespace) -> int:
        explain(args.query, args.json, sys.stdout)
        return 0

    return {"replay": run_replay, "explain": run_explain}


def _take_queries(argv: list[str]) -> list[str]:
    """Take all but the first ``--query VALUE`` (or ``--query=VALUE``) out of ``argv``, in order.  argparse scans
    every option's position for each option it reads: 10,000 queries cost 3 s there, more than their replay."""
    kept: list[str] = []
    taken: list[str] = []
    seen_first = False
    i = 0
    while i < len(argv) and argv[i] != "--":
        arg = argv[i]
        width = 2 if arg == "--query" and i + 1 < len(argv) else 1
        value = argv[i + 1] if width == 2 else arg[len("--query="):] if arg.startswith("--query=") else None
        if value is not None and seen_first:
            taken.append(value)
        else:
            seen_first = seen_first or value is not None
            kept.extend(argv[i:i + width])
        i += width
    argv[:] = kept + argv[i:]
    return taken


def run(argv: list[str] | None, extra: Callable | None = None) -> int:
    """Parse `argv` and run the command; `extra(commands)` may add more commands (the fleet's)."""
    parser = argparse.ArgumentParser(prog="cbgp", description="Continuous SPARQL BGP answers over a changing graph")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    handlers = add_engine_commands(commands)
    if extra is not None:
        handlers.update(extra(commands))
    argv = list(sys.argv[1:] if argv is None else argv)
    queries = _take_queries(argv) if argv[:1] == ["replay"] else []
    args = parser.parse_args(argv)
    if queries:
        args.query = (args.query or []) + queries
    try:
        return handlers[args.command](args)
    except (CliError, EngineError) as exc:
        print(f"cbgp {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130


def main(argv: list[str] | None = None) -> int:
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
