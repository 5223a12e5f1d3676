"""The user's commands: ``cbgp publish | register | unregister | list | watch | current | deadletter``.

All take the shared Kafka flags (or ``CBGP_*`` variables).  What they put on and read from the topics:

- ``publish FILE``: the file's bytes to ``updates.raw`` in records of whole lines (about ``--chunk-bytes``
  each), header ``cbgp-format`` = the input format (plus ``cbgp-source`` = file name and
  ``cbgp-first-line``).  RDF Patch transactions ``TX .. TC/TA`` are never split across records, and the
  patch prefixes (``PA``/``@prefix`` lines) seen so far are repeated at the head of every later record, so
  ingest can parse each record on its own.  Turtle is sent as one record (statements span lines and
  depend on prefixes).  ``FILE`` ``-`` is standard input (then ``--format`` is needed).  Before sending,
  the input is checked with ingest's parsers and limits: each problem ingest would dead-letter is printed as
  ``FILE:LINE: reason``; the input is still published (ingest dead-letters the bad parts) unless
  ``--strict``, and the exit code is 1.  A record over the broker's size limit is never sent.
- ``register / unregister / list``: an Avro ``AdminCommand`` with a fresh ``request_id`` to ``admin``, then
  wait for the ``QueryStatus`` with that id on ``queries.status`` (read from its end offset taken *before*
  sending, so the reply cannot be missed).
- ``watch ID``: ``Answer`` records of the query from ``answers``, as JSON lines, from answer number
  ``--from``; duplicates (n already seen) are dropped, a jump in n is reported on stderr.
- ``current ID``: the query's ``answers.current`` records folded to the latest value per key (the topic is
  compacted, but a broker may not have compacted it yet), as SPARQL 1.1 Query Results JSON or ``--table``.
- ``deadletter``: the ``DeadLetter`` records on ``deadletter`` (inputs a service rejected), one line each,
  from offset ``--from``; ``--follow`` keeps printing new ones until Ctrl-C.

Every command first checks that the broker answers (a few seconds at most): if not, it prints one line
and exits with code 2; librdkafka's own log lines never reach the terminal.

The package, one job a module (callers import from ``services.usercli``, which re-exports every name):
``publish`` (check and send an updates file), ``requests`` (admin commands and registered plans), ``reading``
(watch, current, deadletter), ``commands`` (the argument parsers and handlers), ``errors`` (:class:`UserError`).
"""

from services.usercli.commands import Handler, user_commands
from services.usercli.errors import UserError
from services.usercli.publish import (DEFAULT_CHUNK_BYTES, MAX_PROBLEMS_SHOWN, MAX_RECORD_BYTES, STDIN, check_input,
                                      chunk_lines, publish_file)
# _answer_json: tests/services/usercli/test_usercli.py reads a watch line through it.
from services.usercli.reading import (_answer_json, current_answers, deadletter_line, print_deadletters,  # noqa: F401
                                      results_json, results_table, watch_answers)
from services.usercli.requests import admin_request, format_status, registered_plan

__all__ = ["UserError", "admin_request", "check_input", "chunk_lines", "current_answers", "deadletter_line",
           "format_status", "print_deadletters", "publish_file",
           "results_json", "results_table", "user_commands", "watch_answers"]
