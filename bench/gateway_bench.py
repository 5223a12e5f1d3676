"""The gateway under 1,000 concurrent subscribers: notification latency and the gateway's CPU per notification.

    .venv/bin/python bench/gateway_bench.py [--subscribers 1000] [--queries 10] [--rate 50] [--seconds 20]
                                            [--ws-share 0.5] [--replicas 1] [--slow-clients 0]

Starts an embedded broker and ``--replicas`` ``cbgp gateway`` processes (auth off; several share the queries,
``--share I/N``, and the subscribers of each query are spread over them as a Service would), writes ``--queries`` QueryPlan records to
``queries.plans`` as the registry would, and opens ``--subscribers`` clients spread evenly over the queries: a
``--ws-share`` of them SEPA WebSocket subscriptions (``/subscribe`` with the query's text, reusing its
registration), the rest SSE streams (``/queries/ID/answers``).  Then it writes Answer records to ``answers`` as the
answers service would, ``--rate`` per second in total (round robin over the queries, ``+`` then ``-`` of the same
binding), for ``--seconds``, each stamped ``produced_at_ms`` just before it is produced.

Measured at the clients (one process, asyncio, same clock): the latency from an answer's ``produced_at_ms`` to its
arrival, for every delivered answer (a SEPA notification carrying several answers counts the oldest one's, the
``x-cbgp.produced_at_ms`` field), p50/p99/max; and that every subscriber got every answer exactly once.  Measured
on the gateway: its process CPU (user + system, psutil) over the production window, divided by notifications
(SSE events + SEPA notifications written) and by answers delivered.  The broker and the client process share the
machine: on a loaded 2-core box the figures include their contention.

``--slow-clients K``: K more SSE clients subscribe, from answer 1, to a query given a backlog of large answers
first, with a 4 KB receive buffer, and never read: the gateway must evict each after ``--slow-client-timeout``
(5 s here) while the others' latency stays as it was.

Prints a table and, last, one JSON line (``GB_DEBUG=1``: also the SSE latency per half second of the run, on
stderr: count, max, median ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import aiohttp  # noqa: E402

from cbgp.query.plan import decompose  # noqa: E402
from cbgp.query.sparql import parse_query  # noqa: E402
from services import codec  # noqa: E402
from services.kafka.broker import EmbeddedBroker, free_port  # noqa: E402
from services.kafka.topics import ensure_topics
from services.kafka.client import make_producer, produce_sync  # noqa: E402
from services.wire.records import query_partition  # noqa: E402
from lsbench_fleet import metrics, total  # noqa: E402

EX = "http://example.org/"


def sparql_of(i: int) -> str:
    return f"SELECT ?x WHERE {{ ?x <{EX}p{i}> <{EX}o{i}> }}"


def publish_plans(settings, queries: int) -> None:  # noqa: ANN001
    producer = make_producer(settings)
    for i in range(queries):
        text = sparql_of(i)
        plan = decompose(parse_query(text))
        record = {"query_id": f"q{i}", "sparql": text, "options": {}, "plan_json": json.dumps(plan.to_json()),
                  "projected": list(plan.query.projected), "registered_at_seq": 0, "version": 1}
        produce_sync(producer, settings.topic("queries.plans"), codec.encode("QueryPlan", record), f"q{i}".encode(),
                     partition=query_partition(f"q{i}", settings.partitions))


class Clients:
    def __init__(self) -> None:
        self.latencies: list[float] = []  # seconds, per delivered answer (oldest of a notification for WS)
        self.received: dict[int, list[int]] = {}  # client -> answer numbers received (SSE) / notification ranges
        self.notifications = 0
        self.ready = 0
        self.errors: list[str] = []
        self.slow: list = []

    async def sse(self, session: aiohttp.ClientSession, url: str, cid: int, query: int) -> None:
        got = self.received.setdefault(cid, [])
        try:
            async with session.get(f"{url}/queries/q{query}/answers?from=1") as resp:
                self.ready += 1
                event = None
                async for raw in resp.content:
                    line = raw.decode().rstrip("\n")
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: ") and event == "answer":
                        now = time.time() * 1000
                        answer = json.loads(line[6:])
                        got.append(answer["n"])
                        self.latencies.append((now - answer["produced_at_ms"]) / 1000)
                        self.slow.append((answer["produced_at_ms"], now - answer["produced_at_ms"], "sse", answer["n"]))
                        self.notifications += 1
        except (aiohttp.ClientError, asyncio.CancelledError) as exc:
            if not isinstance(exc, asyncio.CancelledError):
                self.errors.append(f"sse {cid}: {exc}")

    async def ws(self, session: aiohttp.ClientSession, url: str, cid: int, query: int) -> None:
        got = self.received.setdefault(cid, [])
        try:
            async with session.ws_connect(url.replace("http", "ws") + "/subscribe", max_msg_size=0) as ws:
                await ws.send_str(json.dumps({"subscribe": {"sparql": sparql_of(query), "alias": f"c{cid}"}}))
                async for msg in ws:
                    data = json.loads(msg.data)
                    note = data.get("notification")
                    if note is None:
                        self.errors.append(f"ws {cid}: {data}")
                        return
                    if note["sequence"] == 0:
                        self.ready += 1
                        continue
                    now = time.time() * 1000
                    meta = note["x-cbgp"]
                    got.extend(range(meta["from"], meta["to"] + 1))
                    self.latencies.append((now - meta["produced_at_ms"]) / 1000)
                    self.notifications += 1
        except (aiohttp.ClientError, asyncio.CancelledError) as exc:
            if not isinstance(exc, asyncio.CancelledError):
                self.errors.append(f"ws {cid}: {exc}")


def produce_answers(settings, queries: int, rate: float, seconds: float, counts: dict[int, int]) -> None:  # noqa: ANN001
    producer = make_producer(settings, linger_ms=0)
    topic = settings.topic("answers")
    # Connected and idempotence initialised before the clock starts (nobody reads updates.raw here).
    produce_sync(producer, settings.topic("updates.raw"), b"# warm-up\n")
    interval = 1.0 / rate
    start = time.monotonic()
    i = 0
    while time.monotonic() - start < seconds:
        q = i % queries
        n = counts[q] = counts.get(q, 0) + 1
        # + of a new binding, or (every other answer, once there are some) - of the one added 9 answers before:
        # a SEPA notification nets out a + and - of one binding, which would then not show as delivered
        sign, subject = ("-", n - 9) if n % 2 == 0 and n > 9 else ("+", n)
        binding = {"x": {"type": "uri", "value": f"{EX}s{subject}", "datatype": None, "lang": None}}
        record = {"query_id": f"q{q}", "n": n, "seq": n, "sign": sign, "binding": binding,
                  "snapshot": False, "produced_at_ms": int(time.time() * 1000), "version": 1}
        producer.produce(topic, codec.encode("Answer", record), f"q{q}".encode(),
                         partition=query_partition(f"q{q}", settings.partitions))
        producer.poll(0)
        i += 1
        delay = start + i * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    producer.flush(30)


def produce_backlog(settings, query: int, answers: int, size: int) -> None:  # noqa: ANN001
    """``answers`` large answers of query ``query`` (what the slow clients subscribe to from answer 1)."""
    producer = make_producer(settings)
    for n in range(1, answers + 1):
        binding = {"x": {"type": "literal", "value": "x" * size, "datatype": None, "lang": None}}
        record = {"query_id": f"q{query}", "n": n, "seq": n, "sign": "+" if n % 2 else "-", "binding": binding,
                  "snapshot": False, "produced_at_ms": int(time.time() * 1000), "version": 1}
        producer.produce(settings.topic("answers"), codec.encode("Answer", record), f"q{query}".encode(),
                         partition=query_partition(f"q{query}", settings.partitions))
        producer.poll(0)
    producer.flush(60)


async def slow_client(port: int, query: int, stop: asyncio.Event) -> None:
    """An SSE client that asks for everything and reads nothing (its receive buffer: 4 KB)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    _reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(f"GET /queries/q{query}/answers?from=1 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    await stop.wait()
    writer.close()


def start_gateways(tmp: Path, env: dict[str, str], replicas: int, slow_timeout: float) -> list[tuple[str, subprocess.Popen]]:
    ports = [free_port() for _ in range(replicas)]
    peers = ",".join(f"http://127.0.0.1:{p}" for p in ports)
    started = []
    for i, port in enumerate(ports):
        log = open(tmp / f"gateway-{i}.log", "w")
        share = ["--share", f"{i}/{replicas}", "--peers", peers] if replicas > 1 else []
        started.append((f"http://127.0.0.1:{port}", subprocess.Popen(
            [str(ROOT / ".venv" / "bin" / "cbgp"), "gateway", "--port", str(port), "--host", "127.0.0.1",
             "--log-level", "INFO", "--auth", "none",  # (its own, on loopback)
             "--max-connections-per-client", "100000", "--slow-client-timeout", str(slow_timeout), *share],
            env=env, stderr=log, stdout=log)))
    return started


async def run(args: argparse.Namespace) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    broker = EmbeddedBroker(tmp / "broker").start()
    gateways: list[tuple[str, subprocess.Popen]] = []
    try:
        settings = broker.settings(topic_prefix="gb.", partitions=4)
        ensure_topics(settings)
        heavy = args.queries  # the slow clients' query (no other subscriber's): a backlog first
        publish_plans(settings, args.queries + 1)
        if args.slow_clients:
            produce_backlog(settings, heavy, 2_000, 2_000)
        gateways = start_gateways(tmp, {**os.environ, **settings.to_env()}, args.replicas, 5.0)
        urls = [url for url, _proc in gateways]
        clients = Clients()
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            deadline = time.monotonic() + 60
            for url in urls:
                while True:
                    try:
                        async with session.get(url + "/readyz") as r:
                            if r.status == 200:
                                break
                    except aiohttp.ClientConnectionError:
                        pass
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"gateway {url} did not start: see {tmp}")
                    await asyncio.sleep(0.2)
            n_ws = int(args.subscribers * args.ws_share)
            tasks = []
            t_connect = time.monotonic()
            for cid in range(args.subscribers):
                query = cid % args.queries
                url = urls[(cid // args.queries) % len(urls)]  # a query's subscribers spread over the replicas
                coro = clients.ws(session, url, cid, query) if cid < n_ws else clients.sse(session, url, cid, query)
                tasks.append(asyncio.create_task(coro))
                if cid % 50 == 49:
                    await asyncio.sleep(0.05)
            while clients.ready < args.subscribers and time.monotonic() - t_connect < 120:
                await asyncio.sleep(0.1)
            connect_s = time.monotonic() - t_connect
            if clients.ready < args.subscribers:
                raise RuntimeError(f"only {clients.ready} of {args.subscribers} subscribers connected: "
                                   f"{clients.errors[:3]}")
            stop_slow = asyncio.Event()
            slow = [asyncio.create_task(slow_client(int(urls[k % len(urls)].rsplit(":", 1)[1]), heavy, stop_slow))
                    for k in range(args.slow_clients)]
            procs = [psutil.Process(proc.pid) for _url, proc in gateways]
            rss_idle = [p.memory_info().rss for p in procs]
            await asyncio.sleep(1.0)
            cpu0 = [p.cpu_times() for p in procs]
            me = psutil.Process()
            me0 = me.cpu_times()
            load0 = os.getloadavg()[0]
            t0 = time.monotonic()
            counts: dict[int, int] = {}
            producer = threading.Thread(target=produce_answers, args=(settings, args.queries, args.rate,
                                                                      args.seconds, counts))
            producer.start()
            while producer.is_alive():
                await asyncio.sleep(0.2)
            expected = sum(counts.values()) * (args.subscribers // args.queries)
            # until every subscriber has every answer (or 30 s)
            drain = time.monotonic()
            while time.monotonic() - drain < 30:
                delivered = sum(len(v) for v in clients.received.values())
                if delivered >= expected:
                    break
                await asyncio.sleep(0.1)
            cpu1 = [p.cpu_times() for p in procs]
            me1 = me.cpu_times()
            window = time.monotonic() - t0
            rss = [p.memory_info().rss for p in procs]
            pages = [metrics(url + "/metrics") for url in urls]
            stop_slow.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, *slow, return_exceptions=True)
        if os.environ.get("GB_DEBUG"):
            t00 = min(x[0] for x in clients.slow)
            by = {}
            for at, latency, k, n in clients.slow:
                b = by.setdefault(int((at - t00) / 500), [])
                b.append(latency)
            for b in sorted(by):
                print(b * 0.5, len(by[b]), round(max(by[b])), round(statistics.median(by[b])), file=sys.stderr)
        complete = all(sorted(clients.received[cid]) == list(range(1, counts.get(cid % args.queries, 0) + 1))
                       for cid in range(args.subscribers))
        cpus = [(b.user - a.user) + (b.system - a.system) for a, b in zip(cpu0, cpu1)]
        cpu = sum(cpus)
        lat = sorted(clients.latencies)
        written = sum(total(page, "cbgp_gateway_notifications_total") for page in pages)
        evicted = sum(total(page, "cbgp_gateway_evicted_total") for page in pages)

        def pct(p: float) -> float:
            return round(1000 * lat[min(len(lat) - 1, int(p * len(lat)))], 1) if lat else float("nan")

        answers_delivered = sum(len(v) for v in clients.received.values())
        return {
            "subscribers": args.subscribers, "ws": n_ws, "sse": args.subscribers - n_ws, "queries": args.queries,
            "answers_produced": sum(counts.values()), "answer_rate_per_s": args.rate, "seconds": round(window, 1),
            "answers_delivered": answers_delivered, "expected_deliveries": expected, "complete": complete,
            "notifications_received": clients.notifications, "notifications_written": int(written),
            "latency_ms_p50": pct(0.50), "latency_ms_p99": pct(0.99),
            "latency_ms_max": round(1000 * lat[-1], 1) if lat else None,
            "gateway_cpu_s": round(cpu, 2), "gateway_cores": round(cpu / window, 3),
            "gateway_cpu_us_per_notification": round(1e6 * cpu / max(written, 1), 1),
            "gateway_cpu_us_per_answer_delivered": round(1e6 * cpu / max(answers_delivered, 1), 1),
            "gateway_rss_mb": round(sum(rss) / 2**20, 1), "gateway_rss_mb_before": round(sum(rss_idle) / 2**20, 1),
            "replicas": args.replicas, "replica_rss_mb": [round(r / 2**20, 1) for r in rss],
            "replica_cores": [round(c / window, 3) for c in cpus],
            "replica_answers_read": [int(total(page, "cbgp_gateway_answers_read_total")) for page in pages],
            "slow_clients": args.slow_clients, "evicted": int(evicted),
            "connect_s": round(connect_s, 1), "errors": clients.errors[:3],
            "client_cores": round(((me1.user - me0.user) + (me1.system - me0.system)) / window, 3),
            "load_avg_1m_at_start": round(load0, 2), "cpus": os.cpu_count(),
        }
    finally:
        for _url, gateway in gateways:
            gateway.terminate()
        for _url, gateway in gateways:
            try:
                gateway.wait(15)
            except subprocess.TimeoutExpired:
                gateway.kill()
        broker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=10)
    parser.add_argument("--rate", type=float, default=50.0, help="answers per second written, all queries together")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--ws-share", type=float, default=0.5, help="share of subscribers on the SEPA WebSocket")
    parser.add_argument("--replicas", type=int, default=1, help="gateway replicas sharing the queries")
    parser.add_argument("--slow-clients", type=int, default=0, help="SSE clients that never read (to be evicted)")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    rows = [("subscribers (ws / sse)", f"{result['subscribers']} ({result['ws']} / {result['sse']})"),
            ("queries", result["queries"]),
            ("answers written", f"{result['answers_produced']} at {result['answer_rate_per_s']:g}/s"),
            ("answers delivered / expected", f"{result['answers_delivered']} / {result['expected_deliveries']}"
                                             f" ({'complete' if result['complete'] else 'INCOMPLETE'})"),
            ("notifications written", result["notifications_written"]),
            ("latency p50 / p99 / max", f"{result['latency_ms_p50']} / {result['latency_ms_p99']} / "
                                        f"{result['latency_ms_max']} ms"),
            ("gateway CPU", f"{result['gateway_cpu_s']} s over {result['seconds']} s "
                            f"({result['gateway_cores']} core)"),
            ("gateway CPU per notification", f"{result['gateway_cpu_us_per_notification']} us"),
            ("gateway CPU per answer delivered", f"{result['gateway_cpu_us_per_answer_delivered']} us"),
            ("gateway RSS", f"{result['gateway_rss_mb']} MB"),
            ("replicas: RSS / cores / answers read", " | ".join(
                f"{m} MB / {c} / {a}" for m, c, a in zip(result["replica_rss_mb"], result["replica_cores"],
                                                          result["replica_answers_read"]))),
            ("slow clients evicted", f"{result['evicted']} of {result['slow_clients']}"),
            ("client process (all subscribers)", f"{result['client_cores']} core"),
            ("machine load at start (1 min)", f"{result['load_avg_1m_at_start']} on {result['cpus']} CPUs"),
            ("connect all subscribers", f"{result['connect_s']} s")]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print(json.dumps(result))
    return 0 if result["complete"] and result["evicted"] >= result["slow_clients"] else 1


if __name__ == "__main__":
    sys.exit(main())
