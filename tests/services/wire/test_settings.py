"""Whole-number settings: one reader for the services and the cbgp command, which never guesses at a bad value."""

from __future__ import annotations

import subprocess
import sys

import pytest

from services.wire.settings import ms_setting, whole_setting


@pytest.mark.parametrize("raw, expected", [("", 7), ("  ", 7), ("0", 0), ("12", 12), (" 12 ", 12)])
def test_unset_or_whole_values(raw: str, expected: int) -> None:
    assert whole_setting("CBGP_X", 7, environ={"CBGP_X": raw}) == expected


@pytest.mark.parametrize("raw", ["-3", "2.5", "lots", "1e3", "0x10", "٣", "²"])
def test_anything_else_is_the_default_with_one_warning(raw: str, caplog: pytest.LogCaptureFixture) -> None:
    """('²'.isdigit() is true and int('²') raises: such a value must not stop a service at its start.)"""
    with caplog.at_level("WARNING", logger="cbgp.runtime"):
        assert whole_setting("CBGP_X", 7, unit="things", environ={"CBGP_X": raw}) == 7
    line, = caplog.messages
    assert line.startswith(f"event=setting-ignored setting=CBGP_X value={raw} ")
    assert line.endswith("reason='not a whole number of things: using 7'")


def test_a_minimum_is_said_in_the_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="cbgp.runtime"):
        assert whole_setting("CBGP_X", 5, minimum=1, unit="ms", environ={"CBGP_X": "0"}) == 5
        assert whole_setting("CBGP_X", 5, minimum=1, environ={"CBGP_X": "1"}) == 1
    assert caplog.messages == ["event=setting-ignored setting=CBGP_X value=0 "
                               "reason='not a whole number of ms above 0: using 5'"]


def test_milliseconds_come_back_as_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CBGP_X_MS", "250")
    assert ms_setting("CBGP_X_MS", 15) == 0.25
    monkeypatch.setenv("CBGP_X_MS", "0")
    assert ms_setting("CBGP_X_MS", 15) == 0.015 and ms_setting("CBGP_X_MS", 15, minimum=0) == 0.0


def test_reading_a_setting_loads_no_kafka_client() -> None:
    """The cbgp command reads its collector setting first, whatever it goes on to do."""
    code = ("import sys; from services.runtime.gc_tuning import tune_gc; tune_gc({'CBGP_GC_THRESHOLD': 'x'}); "
            "print('confluent_kafka' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == ["False"], done.stderr


def test_the_metrics_query_labels_setting_reads_the_same_way() -> None:
    done = subprocess.run([sys.executable, "-c", "import services.metrics.instruments as i; print(i._query_labels())"],
                          capture_output=True, text=True, timeout=60, env={"CBGP_METRICS_QUERY_LABELS": "²"})
    assert done.returncode == 0 and done.stdout.split() == ["100"], done.stderr
    assert "setting=CBGP_METRICS_QUERY_LABELS" in done.stderr
