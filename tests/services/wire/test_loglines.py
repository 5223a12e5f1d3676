"""A log line is one line: a value from outside cannot split it or forge another field's line."""

from __future__ import annotations

from services.wire.loglines import kv


def test_plain_values_stay_bare_and_others_are_quoted() -> None:
    assert kv(event="checkpoint", seconds=0.25, n=3) == "event=checkpoint seconds=0.25 n=3"
    assert kv(reason="two words", empty="") == "reason='two words' empty=''"


def test_a_line_break_or_control_character_is_escaped() -> None:
    line = kv(value="x\nts=2026 event=forged", tab="a\tb", bell="\x07")
    assert "\n" not in line and "\t" not in line and "\x07" not in line
    assert line == r"value='x\nts=2026 event=forged' tab='a\tb' bell='\x07'"
