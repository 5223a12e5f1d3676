#!/usr/bin/env bash
# Installs Virtuoso Open Source (Debian package virtuoso-opensource, 7.2.5.1 on bookworm), the real SPARQL endpoint
# that the background-data tests and bench/background_bench.py start themselves (cbgp.background.endpoint).
# Idempotent: exits at once when virtuoso-t is already on the PATH.
#
# The package's postinst would start a system-wide daemon on ports 1111/8890 and ask for a DBA password; we never
# use that daemon (each test/bench run starts its own server on a free port with its own database directory), so the
# install is non-interactive and a policy-rc.d that forbids service starts is put in place for the duration of the
# install when the machine does not already have one.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/apt-lib.sh"

if command -v virtuoso-t >/dev/null 2>&1 && command -v isql-vt >/dev/null 2>&1; then
  exit 0
fi

require_root_or_skip "Virtuoso (tests fall back to the pyoxigraph endpoint)"

POLICY=/usr/sbin/policy-rc.d
ADDED_POLICY=""
if [[ ! -e "$POLICY" ]]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
  $SUDO chmod +x "$POLICY"
  ADDED_POLICY=1
fi
cleanup() { if [[ -n "$ADDED_POLICY" ]]; then $SUDO rm -f "$POLICY"; fi; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
echo "==> installing virtuoso-opensource (apt, non-interactive, no service start)"
# Blank DBA password answers for the postinst's debconf questions (unused: we never run the system daemon).
for q in virtuoso-opensource-7/dba-password virtuoso-opensource-7/dba-password-again; do
  echo "virtuoso-opensource-7 $q password " | $SUDO debconf-set-selections 2>/dev/null || true
done
apt_install /tmp/install-virtuoso.log virtuoso-opensource \
  -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold
echo "==> $(virtuoso-t +? 2>&1 | head -1 || echo virtuoso installed)"
