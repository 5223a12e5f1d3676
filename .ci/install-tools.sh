#!/usr/bin/env bash
# Installs helm into .tools/bin (placeholder; completed by the Helm work).
set -euo pipefail
mkdir -p .tools/bin
