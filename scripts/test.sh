#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine, then runs it.
#   - Debian packages: mariadb-server (the tests start their own server on
#     loopback, in a temp datadir), prometheus (prometheus + promtool 2.42) and
#     systemd (systemd-analyze, to verify the unit in deploy/systemd)
#   - a virtualenv in .venv with run-otel and its test extra (rotel, hypothesis, ...)
#   - the Go test peers, built from pinned modules by scripts/peers.sh: Jaeger v2
#     and two OpenTelemetry Collector builds (needs Go >= 1.26 and the module proxy)
# Extra arguments go to pytest, e.g. scripts/test.sh -k mapping
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || need+=(mariadb-server)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# systemd-analyze verifies the unit in deploy/systemd; a container's Debian may lack it.
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
if [ ${#need[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "installing Debian packages: ${need[*]}"
    $SUDO apt-get update -qq
    # The packages' own services are not wanted: the tests start their own servers.
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
bash scripts/peers.sh

# Lint and types first: a wrong name fails in seconds, not after the servers start.
.venv/bin/ruff format --check src tests bench scripts
.venv/bin/ruff check src tests bench scripts
.venv/bin/mypy

exec .venv/bin/python -m pytest "$@"
