"""``cbgp gateway``: SEPA-compatible WebSocket subscriptions, SPARQL 1.1 Protocol, server-sent answers, a REST API
for queries and the web console, on one port.

- ``core``: the hub of registered queries, their answer streams and subscribers; SEPA and SSE message formats;
  bearer-token scopes (no Kafka, no HTTP);
- ``kafka_io``: the topic reader (``queries.plans``, ``answers``), the publisher (``updates.raw``, ``admin``), the
  current graph for ``/query`` (``dictionary`` + ``updates.encoded`` into pyoxigraph), the fleet sampler;
- ``app``: the aiohttp application and the ``cbgp gateway`` command; ``openapi``: its OpenAPI description;
- ``static/``: the console (plain HTML and one script, no build step).
"""
