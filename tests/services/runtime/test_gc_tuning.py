"""CBGP_GC_THRESHOLD sets how often the collector runs in every cbgp process; bad values fall back loudly."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from services.runtime.gc_tuning import DEFAULT_THRESHOLD, OLDER_THRESHOLDS, tune_gc


@pytest.fixture(autouse=True)
def _restore_thresholds():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_default_collects_every_fifty_thousand_allocations():
    gc.set_threshold(700, 10, 10)
    assert tune_gc({}) == (DEFAULT_THRESHOLD, *OLDER_THRESHOLDS)


def test_a_setting_is_taken_and_zero_keeps_pythons_thresholds():
    assert tune_gc({"CBGP_GC_THRESHOLD": "12000"})[0] == 12000
    gc.set_threshold(700, 10, 10)
    assert tune_gc({"CBGP_GC_THRESHOLD": "0"}) == (700, 10, 10)


def test_a_bad_value_warns_in_one_line_and_uses_the_default(caplog):
    with caplog.at_level("WARNING", logger="cbgp.runtime"):
        assert tune_gc({"CBGP_GC_THRESHOLD": "lots"})[0] == DEFAULT_THRESHOLD
    assert caplog.messages == ["event=setting-ignored setting=CBGP_GC_THRESHOLD value=lots "
                               "reason='not a whole number of allocations: using 50000'"]


def test_the_cbgp_command_runs_with_the_setting():
    """`cbgp` applies the setting before it reads its command line (seen in the interpreter after `cbgp --help`)."""
    code = ("import gc, sys; from services.commands.main import main; "
            "sys.argv = ['cbgp', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(gc.get_threshold()[0], file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"CBGP_GC_THRESHOLD": "4321", "PATH": ""})
    assert done.stderr.strip().splitlines()[-1] == "4321"
