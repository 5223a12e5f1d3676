"""The file make run writes for the commands: read only when nothing names a broker, plain CBGP_* lines only."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.kafka.run_env import SOURCE_VARIABLE, load_run_env, write_run_env


def test_the_commands_take_the_run_file_when_nothing_else_names_a_broker(tmp_path: Path) -> None:
    path = write_run_env(tmp_path, {"CBGP_BOOTSTRAP_SERVERS": "127.0.0.1:41234", "CBGP_TOPIC_PREFIX": "cbgp."})
    assert path.stat().st_mode & 0o777 == 0o600
    env = {"CBGP_RUN_DIR": str(tmp_path), "CBGP_TOPIC_PREFIX": "mine."}
    assert load_run_env(env) == path
    assert env["CBGP_BOOTSTRAP_SERVERS"] == "127.0.0.1:41234"
    assert env["CBGP_TOPIC_PREFIX"] == "mine."  # a variable already set wins
    assert env[SOURCE_VARIABLE] == str(path)
    flagged = {"CBGP_RUN_DIR": str(tmp_path), "CBGP_BOOTSTRAP_SERVERS": "kafka:9092"}
    assert load_run_env(flagged) is None and flagged["CBGP_BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert load_run_env({"CBGP_RUN_DIR": str(tmp_path / "none")}) is None


def test_only_plain_cbgp_settings_are_read_or_written(tmp_path: Path) -> None:
    (tmp_path / "cbgp.env").write_text("CBGP_BOOTSTRAP_SERVERS=127.0.0.1:1\nPATH=/tmp/evil\nCBGP_X=$(rm -rf /)\n"
                                       "CBGP_Y=a b\nexport CBGP_Z=1\n")
    env = {"CBGP_RUN_DIR": str(tmp_path)}
    load_run_env(env)
    assert set(env) == {"CBGP_RUN_DIR", "CBGP_BOOTSTRAP_SERVERS", SOURCE_VARIABLE}  # no other name, no spaces
    with pytest.raises(ValueError):
        write_run_env(tmp_path, {"CBGP_TOKEN": "two words"})
    with pytest.raises(ValueError):
        write_run_env(tmp_path, {"LD_PRELOAD": "/x.so"})
