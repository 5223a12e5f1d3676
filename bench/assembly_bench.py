"""Spark assembly and window throughput and latency per micro-batch, on a real broker and PySpark.

    .venv/bin/python bench/assembly_bench.py [--rounds 12] [--updates 400] [--duty assembly|windows|both]

For each duty, the real streaming query (``spark.job.start_stateful``, trigger every second) runs on an
embedded noida-db broker, and the bench feeds it rounds of input, one round at a time:

- assembly: the part deltas a state worker publishes for two multi-part queries (two stars, and a ground
  part gating a star), ``--updates`` random updates per round, one Kafka transaction per 50 updates;
- windows: ``--updates`` encoded updates per round with event times one round = 10 s apart, for a sliding
  window [RANGE PT20S STEP PT5S], so every round both fills and expires answers.

The expected number of answer deltas per round comes from running the same pure-Python core locally
(``cbgp.engine.assembly.Assembler`` / ``cbgp.windows.windowed.WindowedQuery``); a round ends when that many ``part = -1``
records are on deltas.parts.  Per round it prints input records, answer deltas out, and the latency from
the round's last produce to its last answer on the topic; the summary gives medians and throughput
(input records / latency).  The first round pays for Python worker start-up and is reported apart.
local[2]; the machine is shared, so expect +-40% between runs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cbgp.engine.assembly import Assembler, split_parts  # noqa: E402
from cbgp.engine.engine import Engine  # noqa: E402
from cbgp.terms import TermDictionary, iri  # noqa: E402
from cbgp.windows.windowed import WindowedQuery  # noqa: E402
from services import codec  # noqa: E402
from services.kafka.broker import EmbeddedBroker
from services.kafka.config import KafkaSettings
from services.kafka.client import end_offsets, make_producer
from services.kafka.topics import ensure_topics  # noqa: E402
from services.wire.registrations import read_registration  # noqa: E402
from services.wire.records import query_partition  # noqa: E402
from tests.fleet_support import publish_plan  # noqa: E402

EX = "http://example.org/"
ASSEMBLY_QUERIES = {
    "product": f"SELECT ?x ?y WHERE {{ ?x <{EX}type> <{EX}Robot> . ?y <{EX}likes> <{EX}Tea> }}",
    "gated": f"SELECT ?x ?d WHERE {{ <{EX}s0> <{EX}knows> <{EX}s1> . ?x <{EX}likes> ?d }}",
}
WINDOW_QUERY = (f"PREFIX : <{EX}>\nSELECT ?x ?y FROM NAMED WINDOW :w ON :s [RANGE PT20S STEP PT5S]\n"
                "WHERE { WINDOW :w { ?x :knows ?y . ?y :likes :Tea } }")
ROUND_MS = 10_000


def random_update(rng: random.Random, present: set, subjects: int) -> tuple[int, str, str, str]:
    if present and rng.random() < 0.3:
        triple = rng.choice(sorted(present))
        present.discard(triple)
        return (-1, *triple)
    predicate, objects = rng.choice([(f"{EX}type", [f"{EX}Robot", f"{EX}Person"]),
                                     (f"{EX}likes", [f"{EX}Tea", f"{EX}Coffee"]),
                                     (f"{EX}knows", [f"{EX}s{i}" for i in range(subjects)])])
    triple = (iri(f"{EX}s{rng.randrange(subjects)}"), iri(predicate), iri(rng.choice(objects)))
    present.add(triple)
    return (1, *triple)


class AssemblyWorkload:
    duty = "assembly"

    def __init__(self, settings: KafkaSettings, rng: random.Random, updates: int) -> None:
        self.settings, self.rng, self.updates = settings, rng, updates
        self.dictionary = TermDictionary(stable=True)
        self.engine = Engine(self.dictionary)
        self.assemblers = {q: Assembler(text) for q, text in ASSEMBLY_QUERIES.items()}
        self.names: dict[str, tuple[str, int]] = {}
        for query_id, text in ASSEMBLY_QUERIES.items():
            publish_plan(settings, query_id, text)
            for part in split_parts(text):
                self.engine.register(f"{query_id}#{part.index}", part.sparql)
                self.names[f"{query_id}#{part.index}"] = (query_id, part.index)
        self.producer = make_producer(settings, transactional_id="bench-worker")
        self.topic = settings.topic("deltas.parts")
        self.present: set = set()
        self.seq = 0

    def produce_round(self) -> tuple[int, int]:
        """(input records, expected answer deltas)."""
        sent = expected = 0
        self.offsets_used = 0  # records plus one commit marker per partition per transaction
        for start in range(0, self.updates, 50):
            self.producer.begin_transaction()
            partitions = set()
            for _ in range(min(50, self.updates - start)):
                self.seq += 1
                sign, s, p, o = random_update(self.rng, self.present, 40)
                per_query: dict[str, list] = {}
                for index, (name, d_sign, row) in enumerate(self.engine.apply(sign, *map(self.dictionary.encode,
                                                                                         (s, p, o)))):
                    query_id, part = self.names[name]
                    per_query.setdefault(query_id, []).append((part, d_sign, row))
                    record = {"query_id": query_id, "part": part, "seq": self.seq,
                              "sign": "PLUS" if d_sign > 0 else "MINUS",
                              "binding": dict(zip(self.engine.columns(name), row)), "source_partition": -1,
                              "source_offset": self.seq, "index": index, "snapshot": False, "event_time_ms": None}
                    partitions.add(query_partition(query_id, self.settings.partitions))
                    self.producer.produce(self.topic, codec.encode("PartDelta", record), query_id.encode(),
                                          partition=query_partition(query_id, self.settings.partitions))
                    sent += 1
                for query_id, deltas in per_query.items():
                    expected += len(self.assemblers[query_id].apply(deltas))
            self.producer.commit_transaction(30)
            self.offsets_used += len(partitions)
        self.offsets_used += sent
        return sent, expected


class WindowWorkload:
    duty = "windows"

    def __init__(self, settings: KafkaSettings, rng: random.Random, updates: int) -> None:
        self.settings, self.rng, self.updates = settings, rng, updates
        publish_plan(settings, "recent", WINDOW_QUERY)
        plain, spec = read_registration(WINDOW_QUERY, {})
        self.local = WindowedQuery(plain, spec)
        self.dictionary = TermDictionary(stable=True)
        self.producer = make_producer(settings)
        self.topic = settings.topic("updates.encoded")
        self.present: set = set()
        self.seq = 0
        self.now = 1_700_000_000_000

    def produce_round(self) -> tuple[int, int]:
        for i in range(self.updates):
            sign, s, p, o = random_update(self.rng, self.present, 40)
            self.seq += 1
            event_time = self.now + i * ROUND_MS // self.updates
            ids = [self.dictionary.encode(t) for t in (s, p, o)]
            self.local.add(sign, *ids, 0, event_time)
            self.producer.produce(self.topic, codec.encode_encoded(self.seq, "ADD" if sign > 0 else "DEL", *ids, 0,
                                                                   event_time, "bench", 0, self.seq), partition=0)
        self.now += ROUND_MS
        self.producer.flush(30)
        expected = sum(len(r.deltas) for r in self.local.advance(self.now - ROUND_MS // self.updates))
        return self.updates, expected


def records_on_deltas(settings: KafkaSettings) -> int:
    return sum(high for _low, high in end_offsets(settings, settings.topic("deltas.parts")).values())


def run_duty(workload_class, args: argparse.Namespace, spark, settings: KafkaSettings, work: Path) -> list[str]:  # noqa: ANN001
    from spark.job import start_stateful

    workload = workload_class(settings, random.Random(7), args.updates)
    query = start_stateful(spark, settings, workload.duty, work / f"cp-{workload.duty}", 1.0,
                           single_owner=True)  # (its parts come as a single-owner worker sends them)
    rows, latencies, throughputs = [], [], []
    try:
        # deltas.parts holds the assembly's inputs too: answers = records - inputs (- earlier answers)
        inputs_on_deltas = answers_seen = 0
        for round_no in range(1, args.rounds + 1):
            sent, target = workload.produce_round()
            produced_at = time.perf_counter()
            if workload.duty == "assembly":
                inputs_on_deltas += workload.offsets_used
            deadline = produced_at + 300
            while True:
                out = records_on_deltas(settings) - inputs_on_deltas - answers_seen
                if out >= target or time.perf_counter() > deadline or not query.isActive:
                    break
                time.sleep(0.05)
            latency = time.perf_counter() - produced_at
            answers_seen += out
            rows.append(f"  round {round_no:>2}: {sent:>6,} in  {out:>6,} answer deltas out (expected {target:,})  "
                        f"latency {latency:6.2f} s")
            print(rows[-1], flush=True)
            if round_no > 1:
                latencies.append(latency)
                throughputs.append((sent / latency, out / latency))
            if out < target:
                raise RuntimeError(f"{workload.duty}: round {round_no} produced {out} of {target} answer deltas; "
                                   f"query active={query.isActive} exception={query.exception()}")
    finally:
        query.stop()
    summary = (f"{workload.duty}: first round {rows[0].split('latency')[1].strip()}; then median latency "
               f"{statistics.median(latencies):.2f} s (max {max(latencies):.2f} s), median throughput "
               f"{statistics.median(t[0] for t in throughputs):,.0f} input records/s and "
               f"{statistics.median(t[1] for t in throughputs):,.0f} answer deltas/s over {len(latencies)} "
               f"rounds of {args.updates} updates")
    return [summary]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--updates", type=int, default=400, help="updates per round")
    parser.add_argument("--duty", choices=["assembly", "windows", "both"], default="both")
    args = parser.parse_args(argv)
    from spark.session import build_session

    summaries = []
    with tempfile.TemporaryDirectory(prefix="cbgp-assembly-bench-") as tmp:
        work = Path(tmp)
        broker = EmbeddedBroker(work / "broker").start()
        spark = build_session(master="local[2]", app_name="cbgp-assembly-bench")
        try:
            for duty, workload_class in (("assembly", AssemblyWorkload), ("windows", WindowWorkload)):
                if args.duty not in (duty, "both"):
                    continue
                settings = broker.settings(topic_prefix=f"bench-{duty}.")
                ensure_topics(settings)
                print(f"{duty}: {args.rounds} rounds of {args.updates} updates, trigger 1 s", flush=True)
                summaries += run_duty(workload_class, args, spark, settings, work)
        finally:
            spark.stop()
            broker.stop()
    print("\n".join(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
