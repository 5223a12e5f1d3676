#!/usr/bin/env bash
# Installs Debian's Chromium (package `chromium`), the browser the gateway's console test drives headless through
# playwright (tests/test_gateway.py, executable_path=/usr/bin/chromium; playwright's own browser downloads are
# unreachable on these machines).  Idempotent and quiet: exits at once when /usr/bin/chromium exists.
set -euo pipefail

if [[ -x /usr/bin/chromium ]]; then
  exit 0
fi

SUDO=""
if [[ "$(id -u)" != 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "warning: not root and no sudo; skipping Chromium (the console test will be skipped)" >&2
    exit 0
  fi
fi

echo "==> installing Debian's chromium (apt-get)"
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -qq --no-install-recommends chromium >/tmp/install-chromium.log 2>&1; then
  $SUDO apt-get update -qq >>/tmp/install-chromium.log 2>&1
  $SUDO apt-get install -y -qq --no-install-recommends chromium >>/tmp/install-chromium.log 2>&1 \
    || { echo "error: apt-get install chromium failed; see /tmp/install-chromium.log" >&2; tail -20 /tmp/install-chromium.log >&2; exit 1; }
fi
echo "==> $(/usr/bin/chromium --version 2>/dev/null || echo chromium installed)"
