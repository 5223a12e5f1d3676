"""Register options (services.wire.registrations): an unknown key is an error wherever a registration is read."""

from __future__ import annotations

import pytest

from cbgp.query.sparql import QueryError
from services.wire.registrations import REGISTER_OPTIONS, read_registration
from services.registry.core import Registry

QUERY = "SELECT ?a WHERE { ?a <http://ex.org/likes> ?b }"


def test_known_options_are_read() -> None:
    _plain, window = read_registration(QUERY, {"window": "sliding", "range": "PT60S", "step": "PT10S",
                                               "lateness": "PT1S", "late": "admit"})
    assert window is not None and (window.kind, window.range_ms, window.step_ms) == ("sliding", 60000, 10000)
    assert read_registration(QUERY, {})[1] is None


@pytest.mark.parametrize("options, key, hint", [
    ({"windw": "sliding"}, "windw", " (did you mean 'window'?)"),  # used to register a query with no window
    ({"window": "sliding", "range": "PT60S", "stp": "PT1S"}, "stp", " (did you mean 'step'?)"),
    ({"format": "json"}, "format", ""),
])
def test_an_unknown_option_key_is_rejected_naming_it_and_the_known_ones(options: dict, key: str, hint: str) -> None:
    with pytest.raises(QueryError) as info:
        read_registration(QUERY, options)
    assert info.value.message == (f"unknown option {key!r}{hint}: the options are " + ", ".join(REGISTER_OPTIONS))


def test_the_registry_rejects_a_raw_register_command_with_an_unknown_option() -> None:
    registry = Registry()
    decision = registry.decide({"command": "REGISTER", "query_id": "late", "sparql": QUERY,
                                "options": {"windw": "sliding"}, "request_id": "r1"}, lambda: 0)
    assert decision.status["status"] == "REJECTED" and decision.plan is None
    assert decision.status["message"].startswith("unknown option 'windw'")
    assert "late" not in registry.queries
