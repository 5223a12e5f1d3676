#!/usr/bin/env bash
# Installs Debian's Chromium (package `chromium`), the browser the gateway's console test drives headless through
# playwright (tests/test_gateway.py, executable_path=/usr/bin/chromium; playwright's own browser downloads are
# unreachable on these machines).  Idempotent and quiet: exits at once when /usr/bin/chromium exists.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/apt-lib.sh"

if [[ -x /usr/bin/chromium ]]; then
  exit 0
fi

require_root_or_skip "Chromium (the console test will be skipped)"

echo "==> installing Debian's chromium (apt-get)"
export DEBIAN_FRONTEND=noninteractive
apt_install /tmp/install-chromium.log chromium
echo "==> $(/usr/bin/chromium --version 2>/dev/null || echo chromium installed)"
