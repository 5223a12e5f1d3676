"""Where the local fleet listens: ``make run`` writes ``<run-dir>/cbgp.env`` and every ``cbgp`` command reads it
when no flag or variable names a broker, so ``cbgp list`` works right after ``make run`` with nothing exported.

The file holds ``CBGP_*=value`` lines only; each value is checked as plain text (no shell expansion, no code)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping, MutableMapping

FILE_NAME = "cbgp.env"
DEFAULT_RUN_DIR = ".run"
SOURCE_VARIABLE = "CBGP_RUN_ENV"  # set to the file's path when the settings came from it (for error messages)
_LINE = re.compile(r"^(CBGP_[A-Z0-9_]+)=([\x21-\x7e]*)$")  # printable, no spaces or quotes to interpret


def run_env_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("CBGP_RUN_DIR") or DEFAULT_RUN_DIR) / FILE_NAME


def plain_setting(name: str, value: str) -> bool:
    """Whether ``name=value`` is a line the run file can hold (a ``CBGP_*`` name, printable, no spaces)."""
    return _LINE.match(f"{name}={value}") is not None


def write_run_env(run_dir: Path, values: Mapping[str, str]) -> Path:
    """Write ``values`` (``CBGP_*`` names) for the commands to find; readable by the owner only (it may hold a
    token).  Returns the file's path."""
    path = Path(run_dir) / FILE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, value in values.items():
        if not plain_setting(name, value):
            raise ValueError(f"{name}: not a plain CBGP_* setting")
        lines.append(f"{name}={value}\n")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("# written by make run; removed when it stops\n" + "".join(lines))
    tmp.chmod(0o600)
    tmp.replace(path)
    return path


def load_run_env(env: MutableMapping[str, str] | None = None) -> Path | None:
    """Add the run file's settings to ``env`` (default ``os.environ``) when it names no broker itself; variables
    already set win.  Returns the file read, or None.  Lines that are not ``CBGP_NAME=value`` are ignored."""
    env = os.environ if env is None else env
    if env.get("CBGP_BOOTSTRAP_SERVERS"):
        return None
    path = run_env_path(env)
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        match = _LINE.match(line.strip())
        if match and match.group(1) not in env:
            env[match.group(1)] = match.group(2)
    env[SOURCE_VARIABLE] = str(path)
    return path
