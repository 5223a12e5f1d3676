"""The installed `cbgp` command: engine commands (from `cbgp.cli`) plus the fleet's.

Each fleet command module registers itself in `FLEET_COMMANDS`: a function that
adds its subparser(s) and returns their handlers.  Kafka settings come from
`--bootstrap-servers ...` flags or `CBGP_*` environment variables everywhere.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from cbgp.cli import run

Handler = Callable[[argparse.Namespace], int]


def _broker_commands(commands: argparse._SubParsersAction) -> dict[str, Handler]:
    from services.kafka import add_kafka_flags

    doctor = commands.add_parser("doctor", help="check that a Kafka broker has what the fleet needs")
    add_kafka_flags(doctor)
    topics = commands.add_parser("topics", help="create or list the fleet's topics")
    topics.add_argument("action", choices=["create", "list"])
    add_kafka_flags(topics)

    def run_doctor_command(args: argparse.Namespace) -> int:
        from services.kafka import KafkaSettings, format_report, quiet_librdkafka, require_broker, run_doctor

        settings = quiet_librdkafka(KafkaSettings.from_args(args))
        require_broker(settings, hint=False)  # unreachable: one line (main), not a report of one failed check
        checks = run_doctor(settings)
        print(format_report(checks))
        return 0 if all(check.ok for check in checks) else 1

    def run_topics(args: argparse.Namespace) -> int:
        from services.kafka import KafkaSettings, catalogue, ensure_topics, quiet_librdkafka, require_broker

        settings = quiet_librdkafka(KafkaSettings.from_args(args))
        if args.action == "create":
            require_broker(settings)  # `topics list` shows the catalogue without a broker
            created = ensure_topics(settings)
            print(f"created {len(created)} topic(s)" + (": " + ", ".join(created) if created else ""))
        else:
            for entry in catalogue(settings):
                print("  ".join(f"{k}={v}" for k, v in entry.items()))
        return 0

    return {"doctor": run_doctor_command, "topics": run_topics}


# Registration functions of the fleet's command groups, in help order.
FLEET_COMMANDS: list[Callable[[argparse._SubParsersAction], dict[str, Handler]]] = [_broker_commands]
from services.runtime import data_path_commands  # noqa: E402 - ingest, worker, answers
FLEET_COMMANDS.append(data_path_commands)
from services.registry import registry_commands  # noqa: E402 - registry, usercli and run commands
FLEET_COMMANDS.append(registry_commands)


def _spark_commands(commands: argparse._SubParsersAction) -> dict[str, Handler]:
    """`cbgp spark-job`: listed here for help; its own parser (spark.job) reads the arguments."""
    commands.add_parser("spark-job", add_help=False,
                        help="the PySpark job: event-time windows, multi-part assembly, compaction (see cbgp spark-job --help)")
    return {"spark-job": lambda args: _run_spark_job([])}


def _run_spark_job(argv: list[str]) -> int:
    from spark.job import main as spark_main  # lazy: importing pyspark costs seconds

    return spark_main(argv)


FLEET_COMMANDS.append(_spark_commands)


def _add_fleet_commands(commands: argparse._SubParsersAction) -> dict[str, Handler]:
    handlers: dict[str, Handler] = {}
    for register in FLEET_COMMANDS:
        handlers.update(register(commands))
    return handlers


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["spark-job"]:
        return _run_spark_job(args[1:])  # the job has its own flags (--master, --compact-interval, ...)
    from services.kafka import TopicError

    try:
        return run(argv, _add_fleet_commands)
    except TopicError as exc:  # a topic layout the fleet cannot use: say so in one line, not a traceback
        print(f"cbgp: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
