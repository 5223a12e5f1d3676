"""The user commands' argument parsers and handlers (``user_commands``), each turning :class:`UserError` and
broker problems into one line on stderr and an exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

from confluent_kafka import KafkaException

from cbgp.results import FORMATS, JSON, NotAcceptable, negotiate, ordered, serialize, shape_of
from services.kafka.topics import BrokerUnreachable
from services.kafka.config import KafkaSettings, add_kafka_flags
from services.kafka.client import quiet_librdkafka, require_broker
from services.client.errors import UserError
from services.client.publish import DEFAULT_CHUNK_BYTES, STDIN, publish_file
from services.client.reading import current_answers, end_on_ctrl_c, print_deadletters, results_table, watch_answers
from services.client.requests import require_plan, admin_request, format_status

Handler = Callable[[argparse.Namespace], int]


def _options(values: list[str] | None) -> dict[str, str]:
    options = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--option expects KEY=VALUE (e.g. replace=true), got {item!r}")
        options[key.strip()] = value.strip()
    from services.wire.registrations import check_option_keys
    from cbgp.windows.spec import WindowError

    try:
        check_option_keys(options)  # before sending: the registry would reject it too
    except WindowError as exc:
        raise UserError(f"--option: {exc.message}") from None
    return options


def user_commands(commands: argparse._SubParsersAction) -> dict[str, Handler]:
    """Register the user commands; return their handlers."""
    p_pub = add_kafka_flags(commands.add_parser("publish", help="send an updates file to updates.raw"))
    p_pub.add_argument("file", help="RDF Patch, N-Triples, N-Quads, Turtle, JSON lines or SPARQL Update; - = stdin")
    p_pub.add_argument("--format", help="input format (default: from the file name; required for stdin)")
    p_pub.add_argument("--strict", action="store_true",
                       help="publish nothing if the input has problems (default: publish, report them, exit 1)")
    p_pub.add_argument("--chunk-bytes", type=int, default=DEFAULT_CHUNK_BYTES, help="target record size")
    p_pub.add_argument("--progress", action="store_true", help="progress line on stderr (default: when a terminal)")

    p_reg = add_kafka_flags(commands.add_parser("register", help="register a SPARQL query with the registry"))
    p_reg.add_argument("query_id", metavar="ID")
    p_reg.add_argument("file", metavar="FILE.rq", help="the query (- = standard input)")
    p_reg.add_argument("--option", action="append", metavar="KEY=VALUE", help="query option (repeatable), e.g. replace=true")
    p_reg.add_argument("--wait", type=float, default=30.0, metavar="S", help="seconds to wait for the reply (default 30)")

    p_unreg = add_kafka_flags(commands.add_parser("unregister", help="unregister a query"))
    p_unreg.add_argument("query_id", metavar="ID")
    p_unreg.add_argument("--wait", type=float, default=30.0, metavar="S")

    p_list = add_kafka_flags(commands.add_parser("list", help="list the registered queries"))
    p_list.add_argument("--wait", type=float, default=30.0, metavar="S")
    p_list.add_argument("--limit", type=int, default=None, metavar="N",
                        help="list N queries at most (default 1000, at most 10000)")
    p_list.add_argument("--after", default=None, metavar="ID", help="start after this query id (the next page)")

    p_watch = add_kafka_flags(commands.add_parser("watch", help="print a query's answer deltas as JSON lines, live"))
    p_watch.add_argument("query_id", metavar="ID")
    p_watch.add_argument("--from", dest="start", type=int, default=1, metavar="N", help="first answer number (default 1)")
    p_watch.add_argument("--count", type=int, default=None, metavar="K", help="exit after K answers (default: run until Ctrl-C)")

    p_cur = add_kafka_flags(commands.add_parser("current", help="a query's current answers (SPARQL results; RDF "
                                                            "for CONSTRUCT)"))
    p_cur.add_argument("query_id", metavar="ID")
    p_cur.add_argument("--format", choices=sorted(FORMATS), default=None,
                       help="json, xml, csv or tsv (SELECT, ASK; default json); turtle, ntriples, jsonld or rdfxml "
                            "(CONSTRUCT; default turtle)")
    p_cur.add_argument("--table", action="store_true", help="a text table instead (SELECT)")

    p_dead = add_kafka_flags(commands.add_parser("deadletter", help="print the inputs the fleet rejected, one line each"))
    p_dead.add_argument("--from", dest="start", type=int, default=1, metavar="N",
                        help="start at the N-th dead letter (default 1; each line starts with #N, numbered from the "
                             "oldest the topic keeps)")
    p_dead.add_argument("--follow", action="store_true", help="keep printing new dead letters until Ctrl-C")

    def settings_of(args: argparse.Namespace) -> KafkaSettings:
        return quiet_librdkafka(KafkaSettings.from_args(args))  # librdkafka's log lines stay off the terminal

    def connect(args: argparse.Namespace) -> KafkaSettings:
        settings = settings_of(args)
        require_broker(settings)  # a wrong address: one line within seconds, not minutes of librdkafka logs
        return settings

    def guarded(fn: Callable[[argparse.Namespace], int], name: str) -> Handler:
        def handler(args: argparse.Namespace) -> int:
            try:
                return fn(args)
            except UserError as exc:
                print(f"cbgp {name}: error: {exc}", file=sys.stderr)
                return 1
            except BrokerUnreachable as exc:
                print(f"cbgp {name}: error: {exc}", file=sys.stderr)
                return 2
            except KafkaException as exc:
                err = exc.args[0] if exc.args else exc
                print(f"cbgp {name}: error: kafka: {err.str() if hasattr(err, 'str') else err}", file=sys.stderr)
                return 1
        return handler

    def run_publish(args: argparse.Namespace) -> int:
        counts = publish_file(settings_of(args), args.file, args.format, chunk_bytes=max(1, args.chunk_bytes),
                              progress=args.progress or sys.stderr.isatty(), strict=args.strict)
        if counts["problems"]:
            raise UserError(f"{counts['problems']} problem(s) in the input (listed above); ingest dead-letters "
                            "them: see `cbgp deadletter`")
        return 0

    def run_register(args: argparse.Namespace) -> int:
        try:
            sparql = sys.stdin.read() if args.file == STDIN else Path(args.file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read {args.file}: {getattr(exc, 'strerror', None) or exc}") from None
        options = _options(args.option)  # a bad option is reported before any broker is contacted
        status = admin_request(connect(args), {"command": "REGISTER", "query_id": args.query_id,
                                               "sparql": sparql, "options": options}, args.wait)
        print(format_status(status))
        return 0 if status["status"] == "ACCEPTED" else 1

    def run_unregister(args: argparse.Namespace) -> int:
        status = admin_request(connect(args), {"command": "UNREGISTER", "query_id": args.query_id},
                               args.wait)
        print(format_status(status))
        return 0 if status["status"] == "UNREGISTERED" else 1

    def run_list(args: argparse.Namespace) -> int:
        options = {k: str(v) for k, v in (("limit", args.limit), ("after", args.after)) if v is not None}
        status = admin_request(connect(args), {"command": "LIST", "options": options}, args.wait)
        if status["status"] != "LISTED":
            print(format_status(status))
            return 1
        for query_id in status["queries"]:
            print(query_id)
        print(status["message"], file=sys.stderr)
        return 0

    def run_watch(args: argparse.Namespace) -> int:
        if args.count is None:
            end_on_ctrl_c()  # a live watch ends with Ctrl-C
        settings = connect(args)
        plan = require_plan(settings, args.query_id)  # else it would wait forever for answers that never come
        try:
            watch_answers(settings, args.query_id, max(1, args.start), count=args.count, version=plan["version"])
        except KeyboardInterrupt:
            pass  # Ctrl-C is how a live watch ends
        return 0

    def run_current(args: argparse.Namespace) -> int:
        settings = connect(args)
        plan = require_plan(settings, args.query_id)  # answers left by an unregistered query are not current
        rows = current_answers(settings, args.query_id, plan["version"])
        shape = shape_of(plan["sparql"], tuple(plan["projected"]))
        bindings = [binding for binding, mult in rows for _ in range(mult)]
        if args.table:
            print(results_table(list(shape.variables), [(b, 1) for b in ordered(shape, bindings)]))
            return 0
        try:
            media = negotiate(shape.form, fmt=args.format)
        except NotAcceptable as exc:
            raise UserError(str(exc)) from None
        body = serialize(shape, bindings, media)
        if media == JSON:
            body = json.dumps(json.loads(body), indent=2, ensure_ascii=False).encode()
        sys.stdout.buffer.write(body if body.endswith(b"\n") else body + b"\n")
        sys.stdout.flush()
        return 0

    def run_deadletter(args: argparse.Namespace) -> int:
        if args.follow:
            end_on_ctrl_c()
        try:
            print_deadletters(connect(args), max(0, args.start), follow=args.follow)
        except KeyboardInterrupt:
            pass  # Ctrl-C is how --follow ends
        return 0

    runs = {"publish": run_publish, "register": run_register, "unregister": run_unregister, "list": run_list,
            "watch": run_watch, "current": run_current, "deadletter": run_deadletter}
    return {name: guarded(fn, name) for name, fn in runs.items()}
