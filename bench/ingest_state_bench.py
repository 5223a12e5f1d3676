"""Ingest with its state in memory and on disk (``--state-on-disk``): cost per update and memory.

Usage: .venv/bin/python bench/ingest_state_bench.py [--updates 600000] [--repeat 3] [--data DIR]

Runs ingest's transform (``services.ingest.core.IngestProcessor``, the code the service runs per raw record) over
the first ``--updates`` LSBench updates (RDF Patch, 500 per raw record, as ``cbgp publish`` writes them), in
memory and with the state in a RocksDB store, checkpointing every 20,000 updates as the service does every
``--checkpoint-interval`` under load (the checkpoint's time is counted).  Side by side in one process, each
``--repeat`` times, alternating: prints per mode the median CPU microseconds per update (with the range) and
what the state holds in memory at the end (Python objects of the presence set and the term maps, by
``tracemalloc``), and as its last line one JSON object.  Both modes' encoded outputs are compared: they must
be equal.  No Kafka: the broker's cost per record is the same either way.
"""

from __future__ import annotations

import os
import secrets
import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("CBGP_CHECKPOINT_SECRET", secrets.token_hex(32))  # (services that checkpoint need one)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import lsbench  # noqa: E402
from lsbench_fleet import patch_lines  # noqa: E402
from services.ingest.service import save_checkpoint  # noqa: E402
from services.ingest.core import IngestProcessor, RawRecord  # noqa: E402
from services.kafka.config import KafkaSettings  # noqa: E402
from services.state.store import Store  # noqa: E402

S = KafkaSettings(topic_prefix="bench.")
PER_RECORD = 500
CHECKPOINT_EVERY = 20_000


def records(lines: list[str]) -> list[RawRecord]:
    return [RawRecord(("\n".join(lines[i:i + PER_RECORD]) + "\n").encode(), {}, S.topic("updates.raw"), 0,
                      i // PER_RECORD, 1000) for i in range(0, len(lines), PER_RECORD)]


def run(raw: list[RawRecord], on_disk: bool, state_dir: Path, measure_memory: bool) -> dict:
    gc.collect()
    if measure_memory:
        tracemalloc.start()
    with Store(state_dir / ("disk" if on_disk else "memory")) as store:
        processor = IngestProcessor(S, 4, 4)
        if on_disk:
            processor.use_disk(store, 0, 0)
        else:
            processor.track_changes = True
        rows = 0
        since = 0
        encoded_topic = S.topic("updates.encoded")
        digest = 0
        cpu = time.process_time()
        for record in raw:
            for out in processor.accept(record) + processor.flush():
                if out.topic == encoded_topic:
                    digest = hash((digest, out.value[-64:]))  # cheap fingerprint of the encoded stream
            since += PER_RECORD
            if since >= CHECKPOINT_EVERY:
                save_checkpoint(processor, store, {encoded_topic: {0: rows}})
                since = 0
            rows += 1
        save_checkpoint(processor, store, {encoded_topic: {0: rows}})
        cpu = time.process_time() - cpu
        memory = tracemalloc.get_traced_memory()[0] if measure_memory else None
        if measure_memory:
            tracemalloc.stop()
        return {"cpu_s": cpu, "present": len(processor.present), "terms": len(processor.published),
                "seq": processor.seq, "digest": digest, "state_bytes_in_memory": memory}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=600_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--data", type=Path, default=lsbench.DEFAULT_DATA)
    args = parser.parse_args()
    stream = lsbench.build_updates(lsbench.load_or_generate(args.data))
    lines = patch_lines(stream.updates[: args.updates])
    raw = records(lines)
    print(f"ingest state: {len(lines):,} LSBench updates ({stream.source}), {len(raw)} raw records of {PER_RECORD}, "
          f"checkpoint every {CHECKPOINT_EVERY:,} updates; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
          flush=True)
    results: dict[str, list[dict]] = {"memory": [], "disk": []}
    for i in range(args.repeat):
        for mode in ("memory", "disk"):
            with tempfile.TemporaryDirectory(prefix="cbgp-ingest-state-") as tmp:
                result = run(raw, mode == "disk", Path(tmp), measure_memory=False)
            results[mode].append(result)
            print(f"  run {i + 1}/{args.repeat} {mode:6s}: {result['cpu_s'] / len(lines) * 1e6:5.1f} us/update "
                  f"({result['present']:,} present, {result['terms']:,} terms)", flush=True)
    memory = {}
    for mode in ("memory", "disk"):  # once more each under tracemalloc (slower: its time is not counted)
        with tempfile.TemporaryDirectory(prefix="cbgp-ingest-state-") as tmp:
            memory[mode] = run(raw, mode == "disk", Path(tmp), measure_memory=True)["state_bytes_in_memory"]
    same = len({r["digest"] for rs in results.values() for r in rs}) == 1
    summary = {"updates": len(lines), "same_output": same}
    for mode, rs in results.items():
        per = [r["cpu_s"] / len(lines) * 1e6 for r in rs]
        summary[mode] = {"us_per_update_median": round(statistics.median(per), 2),
                         "us_per_update_range": [round(min(per), 2), round(max(per), 2)],
                         "python_bytes_at_end": memory[mode], "present": rs[-1]["present"], "terms": rs[-1]["terms"]}
        print(f"{mode:6s}: {statistics.median(per):5.1f} us/update [{min(per):.1f}-{max(per):.1f}], "
              f"{memory[mode] / 1e6:,.1f} MB of Python objects at the end", flush=True)
    print(f"same encoded output in both modes: {same}")
    print(json.dumps(summary))
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
