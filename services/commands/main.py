"""The installed `cbgp` command: engine commands (from `cbgp.engine_cli`) plus the fleet's, assembled here.

This is the one place that knows every command: it imports the service modules (lazily, so `cbgp explain`
loads no Kafka client), never the reverse.  `FLEET_COMMANDS` lists, in help order, functions that add
their subparser(s) and return their handlers: each service module's own ``register`` (ingest, worker,
answers), the registry's and the user commands (``services.commands.user``).  Kafka settings come from
`--bootstrap-servers ...` flags, `CBGP_*` environment variables, or the file `make run` writes (``.run/cbgp.env``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from cbgp.engine_cli import run
from services.kafka.run_env import load_run_env
from services.runtime.gc_tuning import tune_gc

Handler = Callable[[argparse.Namespace], int]


def _broker_commands(commands: argparse._SubParsersAction) -> dict[str, Handler]:
    from services.kafka.config import add_kafka_flags

    doctor = commands.add_parser("doctor", help="check that a Kafka broker has what the fleet needs")
    add_kafka_flags(doctor)
    topics = commands.add_parser(
        "topics", help="create or list the fleet's topics, print the lowest offsets the fleet still needs, or "
        "delete what lies below them",
        description="create: the missing catalogue topics (partitions, cleanup.policy, retention.ms); list: the "
        "catalogue (no broker needed); floor: JSON {topic: {partition: offset}}, per partition the lowest offset "
        "the fleet still needs (records below it may be deleted without changing any answer); trim: delete the "
        "records below the floor (delete_records) and print what was deleted, as JSON")
    topics.add_argument("action", choices=["create", "list", "floor", "trim"])
    topics.add_argument("--dry-run", action="store_true", help="trim: print what would be deleted, delete nothing")
    add_kafka_flags(topics)

    def run_doctor_command(args: argparse.Namespace) -> int:
        from services.kafka.config import KafkaSettings
        from services.commands.doctor import format_report, run_doctor
        from services.kafka.client import quiet_librdkafka, require_broker

        settings = quiet_librdkafka(KafkaSettings.from_args(args))
        require_broker(settings, hint=False)  # unreachable: one line (main), not a report of one failed check
        checks = run_doctor(settings)
        print(format_report(checks))
        return 0 if all(check.ok for check in checks) else 1

    def run_topics(args: argparse.Namespace) -> int:
        from services.kafka.config import KafkaSettings
        from services.kafka.topics import catalogue, ensure_topics
        from services.kafka.client import quiet_librdkafka, require_broker

        settings = quiet_librdkafka(KafkaSettings.from_args(args))
        if args.action == "floor":
            import json

            from services.commands.floor import floor

            require_broker(settings)
            print(json.dumps(floor(settings)))
        elif args.action == "trim":
            import json

            from services.commands.floor import trim

            require_broker(settings)
            print(json.dumps(trim(settings, dry_run=args.dry_run)))
        elif args.action == "create":
            require_broker(settings)  # `topics list` shows the catalogue without a broker
            created = ensure_topics(settings)
            print(f"created {len(created)} topic(s)" + (": " + ", ".join(created) if created else ""))
        else:
            for entry in catalogue(settings):
                print("  ".join(f"{k}={v}" for k, v in entry.items()))
        return 0

    return {"doctor": run_doctor_command, "topics": run_topics}


def _data_path_commands(commands: argparse._SubParsersAction) -> dict[str, Handler]:
    """``cbgp ingest``, ``cbgp worker``, ``cbgp answers`` and ``cbgp background``: each service module's ``register``."""
    from services.answers import service as answers  # lazy: the CLI's other commands need none of them
    from services.background import service as background
    from services.ingest import service as ingest
    from services.worker import service as worker

    handlers: dict[str, Handler] = {}
    for module in (ingest, worker, answers, background):
        handlers.update(module.register(commands))
    return handlers


def _registry_commands(commands: argparse._SubParsersAction) -> dict[str, Handler]:
    """``cbgp registry`` (the faust service of ``services.registry.service``) and the user commands."""
    from services.kafka.config import add_kafka_flags
    from services.commands.user import user_commands
    from services.runtime.life import port_number

    p = commands.add_parser("registry", help="run the query registry service (admin -> queries.plans + status)")
    add_kafka_flags(p)
    p.add_argument("--metrics-port", type=port_number(), default=None, metavar="PORT",
                   help="serve /metrics /healthz /readyz on this port (0 = any free port)")
    p.add_argument("--web-port", type=port_number(), default=6066, metavar="PORT",
                   help="faust web port for GET /queries and /queries/{id} (default 6066, one per instance; 0 = any "
                        "free port)")
    p.add_argument("--web-host", default="127.0.0.1", help="faust web bind address (default 127.0.0.1)")
    p.add_argument("--state-dir", default=".cbgp-state", metavar="DIR",
                   help="directory for faust's data dir (default .cbgp-state)")
    p.add_argument("--log-level", default="WARNING", type=str.upper, choices=["DEBUG", "INFO", "WARNING", "ERROR"])

    def run_registry(args: argparse.Namespace) -> int:
        from services.kafka.config import KafkaSettings
        from services.kafka.broker import free_port
        from services.registry.service import run_service  # lazy: importing faust costs a second

        web_port = args.web_port or free_port(args.web_host)  # (faust's web server takes no 0)
        return run_service(KafkaSettings.from_args(args), metrics_port=args.metrics_port, web_port=web_port,
                           web_host=args.web_host, state_dir=args.state_dir, log_level=args.log_level)

    return {"registry": run_registry, **user_commands(commands)}


def _spark_commands(commands: argparse._SubParsersAction) -> dict[str, Handler]:
    """`cbgp spark-job`: listed here for help; its own parser (spark.job) reads the arguments."""
    commands.add_parser("spark-job", add_help=False,
                        help="the PySpark job: event-time windows, multi-part assembly, compaction (see cbgp spark-job --help)")
    return {"spark-job": lambda args: _run_spark_job([])}


def _run_spark_job(argv: list[str]) -> int:
    from spark.job import main as spark_main  # lazy: importing pyspark costs seconds

    return spark_main(argv)


def _describe_commands(commands: argparse._SubParsersAction) -> dict[str, Handler]:
    """``cbgp describe SERVICE``: a service's topology (``services.wire.topology``), no broker needed."""
    from services.wire.topology import TOPOLOGIES

    p = commands.add_parser("describe", help="print a service's topology: sources -> processor -> sinks, with keys")
    p.add_argument("service", nargs="?", choices=list(TOPOLOGIES), help="the service (default: every one)")
    p.add_argument("--json", action="store_true", help="print the topology as JSON")

    def run_describe(args: argparse.Namespace) -> int:
        from services.wire.topology import describe, describe_json

        services = [args.service] if args.service else list(TOPOLOGIES)
        if args.json:
            import json

            found = [json.loads(describe_json(name)) for name in services]
            print(json.dumps(found[0] if args.service else found, indent=2))
        else:
            print("\n\n".join(describe(name) for name in services))
        return 0

    return {"describe": run_describe}


def _gateway_commands(commands: argparse._SubParsersAction) -> dict[str, Handler]:
    """``cbgp gateway``: SEPA WebSocket, SPARQL protocol, SSE answers, REST and the console (services.gateway)."""
    from services.gateway.command import register

    return register(commands)


# Registration functions of the fleet's command groups, in help order.
FLEET_COMMANDS: list[Callable[[argparse._SubParsersAction], dict[str, Handler]]] = [
    _broker_commands, _data_path_commands, _registry_commands, _gateway_commands, _spark_commands,
    _describe_commands]


def add_fleet_commands(commands: argparse._SubParsersAction) -> dict[str, Handler]:
    handlers: dict[str, Handler] = {}
    for register in FLEET_COMMANDS:
        handlers.update(register(commands))
    return handlers


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    tune_gc()  # (every cbgp process: the services, the Spark driver, cbgp replay)
    load_run_env()  # the local fleet make run started, unless a flag or variable names a broker
    if args[:1] == ["spark-job"]:
        return _run_spark_job(args[1:])  # the job has its own flags (--master, --compact-interval, ...)
    from services.kafka.topics import TopicError
    from services.kafka.truncation import EXIT_TRUNCATED, LogTruncated
    from services.metrics.exposition import ListenError

    try:
        return run(argv, add_fleet_commands)
    except (TopicError, ListenError) as exc:  # a topic layout the fleet cannot use, a port taken: one line
        print(f"cbgp: error: {exc}", file=sys.stderr)
        return 2
    except LogTruncated as exc:  # records a restore needs were deleted (the registry; the others: run_service)
        print(f"cbgp: error: {exc}", file=sys.stderr)
        return EXIT_TRUNCATED


if __name__ == "__main__":
    sys.exit(main())
