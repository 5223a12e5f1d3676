"""The OpenAPI 3.0 description of the gateway's HTTP part (served at ``GET /openapi.json``; the WebSocket
``/subscribe`` is described in words: OpenAPI has no WebSocket messages).  ``tests/services/gateway/test_gateway.py`` runs
schemathesis against it."""

from __future__ import annotations

from typing import Any

__all__ = ["OPENAPI"]

_ID = {"name": "id", "in": "path", "required": True, "description": "query id",
       "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,128}$"}}


def _json(ref: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": ref}}}}


_ERR = "#/components/schemas/Problem"


def _problem(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/problem+json": {"schema": {"$ref": _ERR}}}}


_AUTH = {"401": _problem("no bearer token, or one that is not valid (the detail says which)"),
         "403": _problem("the token's scope is too small")}
_STRING = {"schema": {"type": "string"}}


def _results(description: str) -> dict[str, Any]:
    """Negotiated by Accept (or ?format=): SPARQL results for SELECT and ASK, RDF for CONSTRUCT."""
    return {"description": description, "content": {
        "application/sparql-results+json": {"schema": {"$ref": "#/components/schemas/SparqlResults"}},
        "application/sparql-results+xml": _STRING, "text/csv": _STRING, "text/tab-separated-values": _STRING,
        "text/turtle": _STRING, "application/n-triples": _STRING, "application/ld+json": {"schema": {}},
        "application/rdf+xml": _STRING}}


_QUERY_LIMITS = {"413": _problem("more rows than --query-max-rows, or more memory than --query-max-memory"),
                 "503": _problem("past --query-timeout, or every /query worker busy")}
_FORMAT = {"name": "format", "in": "query", "required": False,
           "description": "instead of Accept: json, xml, csv, tsv (SELECT, ASK); turtle, ntriples, jsonld, rdfxml "
                          "(CONSTRUCT)", "schema": {"type": "string", "enum": [
                               "json", "xml", "csv", "tsv", "turtle", "ttl", "ntriples", "nt", "jsonld", "json-ld",
                               "rdfxml"]}}

_TERM = {"type": "object", "required": ["type", "value"],
         "properties": {"type": {"type": "string", "enum": ["uri", "literal", "bnode"]}, "value": {"type": "string"},
                        "datatype": {"type": "string"}, "xml:lang": {"type": "string"}}}

OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "cbgp gateway", "version": "1.0.0",
             "description": "Live answers of continuous SPARQL queries: registration, current answers, answers as "
                            "server-sent events (resumable by answer number), the SPARQL 1.1 Protocol (/update, "
                            "/query) and, not described here, the SEPA WebSocket at /subscribe."},
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                       "description": "scope read or read-write; also ?access_token="}},
        "schemas": {
            "Problem": {"type": "object", "required": ["type", "title", "status", "detail"],
                        "description": "RFC 9457 problem details; detail is one line that says what and where",
                        "properties": {"type": {"type": "string"}, "title": {"type": "string"},
                                       "status": {"type": "integer"}, "detail": {"type": "string"},
                                       "line": {"type": "integer"}, "column": {"type": "integer"},
                                       "query_id": {"type": "string"}}},
            "Term": _TERM,
            "Binding": {"type": "object", "additionalProperties": {"$ref": "#/components/schemas/Term"}},
            "SparqlResults": {
                "type": "object", "required": ["head"],
                "properties": {
                    "head": {"type": "object", "properties": {"vars": {"type": "array", "items": {"type": "string"}}}},
                    "results": {"type": "object", "required": ["bindings"], "properties": {
                        "bindings": {"type": "array", "items": {"$ref": "#/components/schemas/Binding"}}}},
                    "boolean": {"type": "boolean"}}},
            "Query": {
                "type": "object",
                "required": ["id", "status", "version", "sparql", "class", "placement", "answers", "current"],
                "properties": {
                    "id": {"type": "string"}, "status": {"type": "string", "enum": ["registered"]},
                    "version": {"type": "integer"}, "sparql": {"type": "string"},
                    "options": {"type": "object", "additionalProperties": {"type": "string"}},
                    "class": {"type": "string"}, "placement": {"type": "string"},
                    "window": {"type": "string", "nullable": True},
                    "projected": {"type": "array", "items": {"type": "string"}},
                    "registered_at_seq": {"type": "integer"},
                    "answers": {"type": "integer", "description": "answers numbered so far (last n)"},
                    "current": {"type": "integer", "description": "current answers (with multiplicity)"},
                    "subscribers": {"type": "integer"}}},
            "QueryList": {"type": "object", "required": ["queries"], "properties": {
                "queries": {"type": "array", "items": {"$ref": "#/components/schemas/Query"}},
                "next": {"type": "string", "description": "the next page's path; absent on the last page"}}},
            "RegisterRequest": {
                "type": "object", "required": ["id", "sparql"],
                "example": {"id": "example", "sparql": "SELECT ?s WHERE { ?s <http://example.org/p> ?o }"},
                "properties": {"id": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,128}$"},
                               "sparql": {"type": "string"},
                               "options": {"type": "object", "additionalProperties": {"type": "string"}}}},
            "StatusReply": {
                "type": "object", "required": ["status", "message"],
                "properties": {"query_id": {"type": "string", "nullable": True},
                               "status": {"type": "string",
                                          "enum": ["ACCEPTED", "REJECTED", "UNREGISTERED", "LISTED", "ERROR"]},
                               "message": {"type": "string"},
                               "line": {"type": "integer", "nullable": True},
                               "column": {"type": "integer", "nullable": True},
                               "query": {"$ref": "#/components/schemas/Query"}}},
            "Published": {"type": "object", "required": ["published_bytes", "topic"],
                          "properties": {"published_bytes": {"type": "integer"}, "topic": {"type": "string"}}},
            "Fleet": {"type": "object", "required": ["state", "gateway"], "properties": {
                "state": {"type": "string", "enum": ["idle", "busy", "unknown"]},
                "rates": {"type": "object", "additionalProperties": {"type": "number"}},
                "lag": {"type": "object", "additionalProperties": {"type": "integer", "nullable": True}},
                "gateway": {"type": "object"}}},
        },
    },
    "security": [{"bearer": []}],
    "paths": {
        "/queries": {
            "get": {"operationId": "listQueries", "summary": "registered queries with class, placement, window, "
                    "in id order, a page at a time (follow next)",
                    "parameters": [
                        {"name": "limit", "in": "query", "required": False,
                         "schema": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 1000}},
                        {"name": "after", "in": "query", "required": False, "schema": {"type": "string"},
                         "description": "the last id of the previous page"}],
                    "responses": {"200": _json("#/components/schemas/QueryList", "the registered queries"),
                                  "400": _problem("a limit outside 1..10000"), **_AUTH}},
            "post": {"operationId": "registerQuery", "summary": "register a query (read-write)",
                     "requestBody": {"required": True, "content": {"application/json": {
                         "schema": {"$ref": "#/components/schemas/RegisterRequest"}}}},
                     "responses": {
                         "201": _json("#/components/schemas/StatusReply", "accepted; the plan reached the gateway"),
                         "400": _problem("rejected (the detail says why, line and column where)"),
                         "409": _problem("the id is registered with another text"),
                         "429": _problem("the fleet's or the owner's query limit is reached, or the owner's "
                                         "registrations per minute"),
                         "504": _problem("no reply from the registry"), **_AUTH}},
        },
        "/queries/{id}": {
            "parameters": [_ID],
            "get": {"operationId": "getQuery", "responses": {
                "200": _json("#/components/schemas/Query", "the query"),
                "404": _problem("not registered"), **_AUTH}},
            "delete": {"operationId": "unregisterQuery", "summary": "unregister (read-write)", "responses": {
                "200": _json("#/components/schemas/StatusReply", "unregistered"),
                "404": _problem("not registered"),
                "504": _problem("no reply from the registry"), **_AUTH}},
        },
        "/queries/{id}/current": {
            "parameters": [_ID],
            "get": {"operationId": "currentAnswers", "summary": "the current answers (SPARQL 1.1 results, or RDF for "
                                                                "CONSTRUCT)", "parameters": [_FORMAT],
                    "responses": {
                        "200": _results("current answers, in the order of the query's ORDER BY"),
                        "406": _problem("no accepted type fits the query's form"),
                        "404": _problem("not registered"),
                        "502": _problem("the replica holding the query (--share) cannot be reached"), **_AUTH}},
        },
        "/queries/{id}/answers": {
            "parameters": [_ID],
            "get": {"operationId": "answerEvents",
                    "summary": "numbered answers as server-sent events (id = n; Last-Event-ID resumes after it)",
                    "parameters": [
                        {"name": "from", "in": "query", "schema": {"type": "integer", "minimum": 1, "default": 1}},
                        {"name": "live", "in": "query", "schema": {"type": "boolean", "default": True},
                         "description": "false: end after the answers read so far"},
                        {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"}}],
                    "responses": {
                        "200": {"description": "event stream: 'answer' events (data = JSON answer), 'end' when the "
                                               "query is registered again, 'gap' when answers before the "
                                               "oldest kept (--history) were asked for",
                                "content": {"text/event-stream": {"schema": {"type": "string"}}}},
                        "400": _problem("bad from / Last-Event-ID"),
                        "404": _problem("not registered"),
                        "421": _problem("asked by another replica, but this replica does not hold the query"),
                        "502": _problem("the replica holding the query (--share) cannot be reached"), **_AUTH}},
        },
        "/replica/queries/{id}": {
            "parameters": [_ID],
            "get": {"operationId": "replicaCopy",
                    "summary": "for another gateway replica (--share): the current answers with multiplicities and "
                               "the number of the last answer they reflect",
                    "responses": {
                        "200": {"description": "the holder's copy", "content": {"application/json": {"schema": {
                            "type": "object", "required": ["query", "version", "last", "rows"],
                            "properties": {"query": {"type": "string"}, "version": {"type": "integer"},
                                           "last": {"type": "integer"},
                                           "rows": {"type": "array", "items": {"type": "object", "properties": {
                                               "binding": {"type": "object"},
                                               "multiplicity": {"type": "integer"}}}}}}}}},
                        "404": _problem("not registered"),
                        "421": _problem("asked by another replica, but this replica does not hold the query"),
                        **_AUTH}},
        },
        "/update": {
            "post": {"operationId": "sparqlUpdate", "summary": "SPARQL 1.1 Update, published to updates.raw",
                     "requestBody": {"required": True, "content": {
                         "application/sparql-update": {"schema": {"type": "string"}},
                         "application/x-www-form-urlencoded": {"schema": {
                             "type": "object", "required": ["update"],
                             "properties": {"update": {"type": "string"}}},
                             "example": {"update": "INSERT DATA { <http://example.org/s> <http://example.org/p> "
                                                   "<http://example.org/o> }"}}}},
                     "responses": {"200": _json("#/components/schemas/Published", "acknowledged by the broker"),
                                   "400": _problem("not a valid update request"),
                                   "415": _problem("unsupported content type"),
                                   "503": _problem("the broker did not take it"), **_AUTH}},
        },
        "/query": {
            "get": {"operationId": "sparqlQueryGet", "summary": "SPARQL 1.1 query over the current graph",
                    "parameters": [{"name": "query", "in": "query", "required": True, "schema": {"type": "string"},
                                    "example": "SELECT ?s ?o WHERE { ?s <http://example.org/p> ?o } LIMIT 10"},
                                   _FORMAT],
                    "responses": {
                        "200": _results("results"), "406": _problem("no accepted type fits the query's form"),
                        "400": _problem("not a valid query"), **_QUERY_LIMITS, **_AUTH}},
            "post": {"operationId": "sparqlQueryPost", "summary": "SPARQL 1.1 query over the current graph",
                     "parameters": [_FORMAT],
                     "requestBody": {"required": True, "content": {
                         "application/sparql-query": {"schema": {"type": "string"}},
                         "application/x-www-form-urlencoded": {"schema": {
                             "type": "object", "required": ["query"], "properties": {"query": {"type": "string"}}},
                             "example": {"query": "ASK { ?s ?p ?o }"}}}},
                     "responses": {
                         "200": _results("results"), "406": _problem("no accepted type fits the query's form"),
                         "400": _problem("not a valid query"), "415": _problem("unsupported content type"),
                         **_QUERY_LIMITS, **_AUTH}},
        },
        "/fleet": {
            "get": {"operationId": "fleet", "summary": "throughput, lag, idle/busy",
                    "responses": {"200": _json("#/components/schemas/Fleet", "the fleet now"), **_AUTH}},
        },
        "/healthz": {"get": {"operationId": "healthz", "security": [], "responses": {
            "200": {"description": "alive", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        "/readyz": {"get": {"operationId": "readyz", "security": [], "responses": {
            "200": {"description": "ready", "content": {"text/plain": {"schema": {"type": "string"}}}},
            "503": {"description": "still reading the topics", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
    },
}
