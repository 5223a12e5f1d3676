"""Avro encoding of every Kafka message value, in Avro's standard *single-object encoding*.

Wire format (Avro spec, "Single-object encoding")::

    0xC3 0x01 | 8-byte little-endian CRC-64-AVRO fingerprint of the writer schema's canonical form | body

so each message names the exact schema that wrote it.  The writer registry holds the current schemas
(``schemas/*.avsc``) and every previous version (``schemas/history/<Name>.v<N>.avsc``); :func:`decode`
looks the fingerprint up and resolves the writer schema against the current reader schema, so a service
reads records written before (or after, within the evolution rules in ``schemas/README.md``) a schema
change.  Bodies are written by fastavro's ``schemaless_writer``; any Avro implementation can read them.

Per-message cost is what matters here: schemas are parsed once, the header is precomputed, and a record
written with the current schema is read without resolution.

The package, one job a module (callers import from ``services.codec``, which re-exports every name):

- ``registry``: the schema registry, fingerprints, :class:`CodecError`;
- ``generic``: any record to and from bytes through fastavro (:func:`encode`, :func:`decode`);
- ``binary``: Avro's binary primitives for the fixed-layout (hot-path) writers and readers;
- ``changes``: graph changes on updates.encoded / updates.routed (format-1 records, format-2 and
  format-3 batches);
- ``deltas``: query-part deltas on deltas.parts (PartDeltaColumns; PartDelta; PartDeltaBatch still read);
- ``control``: Frontier, ProbeBatch and ProbeReady records;
- ``answers``: answer semantics (SparqlTerm conversions, canonical bindings, answers.current keys, Answer
  and CurrentAnswer writers).
"""

from services.codec.answers import (BindingWriter, answer_binding, canonical_binding, current_key, decode_answer,
                                    decode_answer_json, encode_answer, encode_answer_record, encode_current_answer,
                                    encode_current_answer_record, json_string, sparql_json_term, term_from_avro,
                                    term_to_avro)
from services.codec.changes import (decode_dictionary_entry, decode_encoded, decode_routed, dictionary_entries,
                                    encode_dictionary_columns, encode_dictionary_entry, encode_encoded, encode_encoded_batch, encode_routed, encode_routed_batch,
                                    encoded_changes, encoded_columns, inserted_at, encoded_records, routed_changes)
from services.codec.control import (encode_frontier, encode_probe_batch, encode_probe_ready, frontier_of,
                                    frontiers_of, probe_batch_of, probe_ready_of)
from services.codec.deltas import (PartDeltaColumns, decode_part_delta, encode_part_delta, encode_part_delta_batch,
                                   part_delta_columns, part_deltas)
from services.codec.generic import decode, decode_any, encode
from services.codec.registry import (HEADER_LEN, MAGIC, NAMESPACE, SCHEMA_DIR, CodecError, crc64_avro, fingerprint,
                                     record_names, reg, schema, writer_name)
# Two private helpers the Spark jobs use (spark/window_stream.py: the cheap header check; spark/assembly_stream.py: the
# fingerprints of the schema history); they keep their old address ``codec.writer_name`` / ``codec.reg``.

__all__ = [
    "BindingWriter", "answer_binding", "canonical_binding", "current_key", "decode_answer", "decode_answer_json",
    "encode_answer", "encode_answer_record",
    "encode_current_answer", "encode_current_answer_record", "json_string", "sparql_json_term", "term_from_avro",
    "term_to_avro", "decode_dictionary_entry", "dictionary_entries", "encode_dictionary_columns", "decode_encoded",
    "decode_routed", "encode_dictionary_entry", "encode_encoded",
    "encode_encoded_batch", "encode_routed", "encode_routed_batch", "encoded_changes", "encoded_columns",
    "inserted_at", "encoded_records", "routed_changes",
    "encode_frontier", "encode_probe_batch", "encode_probe_ready", "frontier_of", "frontiers_of", "probe_batch_of",
    "probe_ready_of", "PartDeltaColumns", "decode_part_delta", "encode_part_delta", "encode_part_delta_batch",
    "part_delta_columns", "part_deltas", "decode", "decode_any", "encode", "HEADER_LEN", "MAGIC", "NAMESPACE",
    "SCHEMA_DIR", "CodecError", "crc64_avro", "fingerprint", "record_names", "reg", "schema", "writer_name"
]
