"""Bad ports and intervals, from a flag or from the environment, are one usage line (exit 2) before a service
starts: not a traceback when the server binds."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from services.runtime.life import port_number


def test_a_port_is_a_number_from_0_to_65535() -> None:
    parse = port_number("CBGP_X_PORT")
    assert parse("0") == 0 and parse("65535") == 65535 and parse(" 8080 ") == 8080
    for bad in ("-1", "65536", "http", "", "80.5"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"is not a port number from 0 to 65535 \(the flag, "
                                                             r"or env CBGP_X_PORT\)"):
            parse(bad)


@pytest.mark.parametrize("args, env, line", [
    (["gateway", "--auth", "none", "--port", "70000"], {},
     "cbgp gateway: error: argument --port: '70000' is not a port number from 0 to 65535"),
    (["gateway", "--auth", "none"], {"CBGP_GATEWAY_PORT": "http"},
     "cbgp gateway: error: argument --port: 'http' is not a port number from 0 to 65535 (the flag, or env "
     "CBGP_GATEWAY_PORT)"),
    (["worker"], {"CBGP_METRICS_PORT": "9o00"},
     "cbgp worker: error: argument --metrics-port: '9o00' is not a port number from 0 to 65535"),
    (["registry", "--web-port", "-3"], {},
     "cbgp registry: error: argument --web-port: '-3' is not a port number from 0 to 65535"),
    (["ingest"], {"CBGP_CHECKPOINT_INTERVAL": "often"},
     "cbgp ingest: error: argument --checkpoint-interval: invalid float value: 'often'"),
])
def test_a_bad_port_or_interval_is_one_usage_line(args: list[str], env: dict[str, str], line: str) -> None:
    done = subprocess.run([sys.executable, "-m", "services.commands.main", *args], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin", **env})
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(line)


def test_an_idle_pause_that_is_not_a_whole_number_of_milliseconds_is_ignored_and_said_to_be() -> None:
    done = subprocess.run([sys.executable, "-c", "import services.kafka.fetch as f; "
                           "print(f.IDLE_PAUSE_SECONDS, f.IDLE_PAUSE_MAX_SECONDS)"],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin", "CBGP_IDLE_PAUSE_MS": "2.5", "CBGP_IDLE_PAUSE_MAX_MS": "120"})
    assert done.returncode == 0 and done.stdout.split() == ["0.015", "0.12"]
    warning, = [line for line in done.stderr.splitlines() if "setting-ignored" in line]
    assert "setting=CBGP_IDLE_PAUSE_MS value=2.5" in warning and "using 15" in warning


def test_the_deep_idle_pause_is_a_setting_and_never_shorter_than_the_longest_idle_pause() -> None:
    def read(env: dict[str, str]) -> list[str]:
        done = subprocess.run([sys.executable, "-c", "import services.kafka.fetch as f; "
                               "print(f.IDLE_DEEP_AFTER_SECONDS, f.IDLE_PAUSE_DEEP_SECONDS)"],
                              capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin", **env})
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert read({}) == ["60.0", "0.25"]
    assert read({"CBGP_IDLE_DEEP_AFTER_MS": "5000", "CBGP_IDLE_PAUSE_DEEP_MS": "500"}) == ["5.0", "0.5"]
    assert read({"CBGP_IDLE_PAUSE_DEEP_MS": "20"}) == ["60.0", "0.06"], "at most the longest pause: off"


def test_ingest_reads_its_deep_pause_from_a_setting_never_shorter_than_the_longest_idle_pause() -> None:
    def read(env: dict[str, str]) -> str:
        done = subprocess.run([sys.executable, "-c", "import services.ingest.service as s; print(s.DEEP_PAUSE_SECONDS)"],
                              capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin", **env})
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert read({}) == "0.06"
    assert read({"CBGP_INGEST_IDLE_PAUSE_DEEP_MS": "250"}) == "0.25", "the fleet's deep pause, as before"
    assert read({"CBGP_INGEST_IDLE_PAUSE_DEEP_MS": "5"}) == "0.06", "at most the longest pause"
