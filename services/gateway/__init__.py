"""``cbgp gateway``: SEPA-compatible WebSocket subscriptions, SPARQL 1.1 Protocol, server-sent answers, a REST API
for queries and the web console, on one port.

- ``core``: the hub of registered queries, their answer streams and subscribers; SEPA and SSE message formats;
  bearer-token scopes (no Kafka, no HTTP);
- ``kafka_io``: the topic reader (``queries.plans``, ``answers``), the publisher (``updates.raw``, ``admin``), the
  current graph for ``/query`` (``dictionary`` + ``updates.encoded`` into pyoxigraph), the fleet sampler;
- ``service``: :class:`Gateway`, the parts above wired together and the live state requests see, and the
  gateway's metrics;
- ``app``: the aiohttp application (routes, auth, SSE, the SEPA WebSocket); ``openapi``: its OpenAPI description;
- ``server``: running it (tokens, TLS, the socket, signals); ``command``: the ``cbgp gateway`` flags;
- ``static/``: the console (plain HTML and one script, no build step).
"""
