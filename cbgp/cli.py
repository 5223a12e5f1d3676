"""Engine commands of the `cbgp` CLI: `replay` and `explain` (no Kafka here).

`cbgp replay --patch UPDATES.rdfp --query NAME=FILE.rq [...] [--out FILE]`
writes one JSON line per delta answer:
    {"query": NAME, "seq": K, "sign": "+"|"-", "binding": {VAR: TERM}}
K is the 1-based position of the causing update among the patch's A/D lines,
VAR has no '?', TERM is a SPARQL 1.1 Query Results JSON term.

The fleet's commands (ingest, worker, ...) are added by `services.cli`, which
is the installed `cbgp` entry point; this module stays free of Kafka.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable, TextIO

from cbgp.engine import Engine, EngineError
from cbgp.plan import decompose
from cbgp.sparql import QueryError, parse_query
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


def _parse_query_file(path: str):  # noqa: ANN202
    from cbgp.windows import parse_rspql

    text = _read_text(path)
    try:
        if parse_rspql(text)[1] is not None:
            raise CliError(f"{path}: the query declares an event-time window; replay evaluates a stream without "
                           "event times, so register windowed queries with the fleet (their Spark job)")
        return parse_query(text)
    except QueryError as exc:  # WindowError included
        where = f":{exc.line}:{exc.column}" if exc.line is not None else ""
        raise CliError(f"{path}{where}: {exc.message}") from None


def _query_args(values: list[str]) -> list[tuple[str, str]]:
    pairs = []
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise CliError(f"--query expects NAME=FILE.rq, got {value!r}")
        pairs.append((name, path))
    names = [n for n, _ in pairs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
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
           fmt: str = "patch", progress: bool = False, errors: TextIO = sys.stderr) -> dict[str, int]:
    """Replay a recorded stream through the engine; write deltas as JSON lines. Returns counters."""
    from cbgp.inputs import InputError, InputFormatError, parse_input

    engine = Engine()
    for name, path in queries:
        engine.register(name, _parse_query_file(path))
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
    meter = _Progress(progress, text.count("\n") + 1)
    write = out.write
    dumps = json.dumps
    try:
        for item in parse_input(text, fmt, strict=strict):
            if isinstance(item, InputError):
                counters["errors"] += 1
                print(f"{patch_path}:{item.line}: {item.message}", file=errors)
                continue
            counters["updates"] += 1
            g = DEFAULT_GRAPH_ID if item.g is None else encode(item.g)
            deltas = engine.apply(item.op, encode(item.s), encode(item.p), encode(item.o), g)
            for name, sign, row in deltas:
                binding = {var: term_json(value) for var, value in zip(columns[name], row)}
                write(dumps({"query": name, "seq": item.position, "sign": "+" if sign > 0 else "-",
                             "binding": binding}) + "\n")
            counters["deltas"] += len(deltas)
            if progress and counters["updates"] % 4096 == 0:
                meter.tick(item.line, counters["updates"])
    except InputFormatError as exc:
        raise CliError(f"{patch_path}: {exc}") from None
    meter.done(counters["updates"], counters["deltas"])
    return counters


def explain(path: str, as_json: bool, out: TextIO) -> None:
    plan = decompose(_parse_query_file(path))
    if as_json:
        json.dump(plan.to_json(), out, indent=2)
        out.write("\n")
    else:
        out.write(plan.explain() + "\n")


def add_engine_commands(commands: argparse._SubParsersAction) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Register `replay` and `explain`; return their handlers by command name."""
    p = commands.add_parser("replay", help="replay a recorded update stream and print delta answers as JSON lines")
    p.add_argument("--patch", required=True, help="updates file (RDF Patch by default)")
    p.add_argument("--query", action="append", required=True, metavar="NAME=FILE.rq", help="a query (repeatable)")
    p.add_argument("--out", help="write deltas here instead of standard output")
    p.add_argument("--format", default="patch", choices=["patch", "ntriples", "nquads", "turtle", "jsonl"],
                   help="format of the updates file (default: patch)")
    p.add_argument("--strict", action="store_true", help="stop at the first malformed line")
    p.add_argument("--progress", action="store_true", help="show progress on stderr (default: when it is a terminal)")

    e = commands.add_parser("explain", help="show how a query is decomposed and evaluated")
    e.add_argument("query", help="a .rq file")
    e.add_argument("--json", action="store_true", help="machine-readable output")

    def run_replay(args: argparse.Namespace) -> int:
        queries = _query_args(args.query)
        progress = args.progress or sys.stderr.isatty()
        if args.out:
            with open(args.out, "w", encoding="utf-8") as out:
                counters = replay(args.patch, queries, out, strict=args.strict, fmt=args.format, progress=progress)
        else:
            counters = replay(args.patch, queries, sys.stdout, strict=args.strict, fmt=args.format,
                              progress=progress)
        if counters["errors"]:
            print(f"cbgp replay: {counters['errors']} malformed line(s) skipped (see above)", file=sys.stderr)
        return 0

    def run_explain(args: argparse.Namespace) -> int:
        explain(args.query, args.json, sys.stdout)
        return 0

    return {"replay": run_replay, "explain": run_explain}


def run(argv: list[str] | None, extra: Callable | None = None) -> int:
    """Parse `argv` and run the command; `extra(commands)` may add more commands (the fleet's)."""
    parser = argparse.ArgumentParser(prog="cbgp", description="Continuous SPARQL BGP answers over a changing graph")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    handlers = add_engine_commands(commands)
    if extra is not None:
        handlers.update(extra(commands))
    args = parser.parse_args(argv)
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
