#!/usr/bin/env bash
# Installs the benchmark's optional peer, pathway (pinned in bench/requirements-bench.txt), into a
# separate venv.  Why separate: pathway 0.33.0 pins pyarrow 25 and pulls ~90 packages that would
# change the project's .venv (pyarrow 26.0.1 is pinned there for Spark).  engine_bench.py runs the
# pathway leg as a subprocess of this venv's python.  The wheel is ~105 MB: about 1.5 min.
# Idempotent: a stamp file skips the install when requirements-bench.txt has not changed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${PATHWAY_VENV:-$here/out/pathway-venv}"
req="$here/requirements-bench.txt"
stamp="$venv/.installed-stamp"
python="${PYTHON:-python3}"
if [[ -f "$stamp" && "$stamp" -nt "$req" ]]; then
  echo "pathway venv up to date: $venv"
  exit 0
fi
echo "==> installing $(grep -v '^#' "$req" | xargs) into $venv (~1.5 min)"
mkdir -p "$(dirname "$venv")"
test -x "$venv/bin/python" || "$python" -m venv "$venv"
"$venv/bin/pip" install --progress-bar off --quiet -r "$req"
"$venv/bin/python" -c "import pathway, sys; print('pathway', pathway.__version__, 'in', sys.prefix)"
touch "$stamp"
