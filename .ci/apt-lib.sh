# Shared by the .ci/install-*.sh scripts (sourced, not run): root-or-sudo detection and a retried apt-get install.

# Sets SUDO ("" as root, else "sudo"); with neither, warns "skipping WHAT" and exits the script with 0.
require_root_or_skip() {
  SUDO=""
  if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
      echo "warning: not root and no sudo; skipping $1" >&2
      exit 0
    fi
  fi
}

# apt_install LOG PACKAGE [APT-OPTION...]: a quiet apt-get install of PACKAGE, output in LOG; on failure, an
# apt-get update and one more try; if that fails too, the log's tail and exit 1.
apt_install() {
  local log=$1 package=$2
  local apt=(apt-get install -y -qq --no-install-recommends "${@:3}" "$package")
  if ! $SUDO "${apt[@]}" >"$log" 2>&1; then
    $SUDO apt-get update -qq >>"$log" 2>&1
    $SUDO "${apt[@]}" >>"$log" 2>&1 \
      || { echo "error: apt-get install $package failed; see $log" >&2; tail -20 "$log" >&2; exit 1; }
  fi
}
