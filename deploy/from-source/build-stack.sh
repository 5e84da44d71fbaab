#!/usr/bin/env bash
# Build the stack's real components from the Go module proxy, to run deploy/'s configs without Docker
# (tests/test_stack.py runs them): the OpenTelemetry Collector (the collector builder, exactly the components
# of deploy/otel-collector/config.yaml), Jaeger v2 (github.com/jaegertracing/jaeger/cmd/jaeger), Prometheus v3
# and promtool. Versions are pinned by otelcol/builder-config.yaml and the go.mod of jaeger/ and prometheus/:
# the nearest the module proxy serves to what deploy/docker-compose.yml pinned, and the compose file now names
# the same: Collector 0.148.0, Jaeger 2.13.0 (module v1.76.0), Prometheus 3.10.0 (module v0.310.0).
# On this project's 2-core machine with empty Go caches: Collector 107 s, Jaeger 290 s (download and build);
# Prometheus and promtool about 8 minutes more (built alongside other work).
# Binaries go to $TORCHDIST_STACK_BIN (default ~/.cache/otel-torchdist/stack/bin); a binary already built from
# the same inputs (this script, the component's go.mod/go.sum or builder config, the Go version) is kept.
# Go's module and build caches make a second run on the same machine fast.
#
#   bash deploy/from-source/build-stack.sh            # all of them
#   bash deploy/from-source/build-stack.sh jaeger     # one: otelcol, jaeger, prometheus (with promtool)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
BIN="${TORCHDIST_STACK_BIN:-$HOME/.cache/otel-torchdist/stack/bin}"
COLLECTOR_VERSION=0.148.0  # as otelcol/builder-config.yaml (deploy/docker-compose.yml pins the same)
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
mkdir -p "$BIN"

if ! command -v go >/dev/null 2>&1; then
    echo "build-stack: no Go toolchain on this machine: the real Collector, Jaeger and Prometheus cannot be built" >&2
    exit 3
fi

stamp() {  # what a binary was built from
    cat "$HERE/build-stack.sh" "$@" | sha256sum | cut -c1-16
    go version
}

fresh() {  # fresh NAME INPUTS...: the binary exists and was built from these inputs
    local name="$1"; shift
    [ -x "$BIN/$name" ] && [ -f "$BIN/$name.stamp" ] && [ "$(stamp "$@")" = "$(cat "$BIN/$name.stamp")" ]
}

timed() {  # timed NAME COMMAND...: run it, say how long it took
    local name="$1" t0; shift
    t0=$(date +%s)
    "$@"
    echo "build-stack: $name built in $(( $(date +%s) - t0 )) s -> $BIN/$name"
}

build_otelcol() {
    local inputs=("$HERE/otelcol/builder-config.yaml")
    if fresh otelcol-torchdist "${inputs[@]}"; then echo "build-stack: otelcol-torchdist is up to date"; return; fi
    local work
    work="$(mktemp -d)"
    sed "s|output_path: ./_build|output_path: $work/dist|" "$HERE/otelcol/builder-config.yaml" > "$work/builder-config.yaml"
    timed otelcol-torchdist bash -c "
        go run go.opentelemetry.io/collector/cmd/builder@v$COLLECTOR_VERSION --config '$work/builder-config.yaml' >'$work/builder.log' 2>&1 \
            || { cat '$work/builder.log' >&2; exit 1; }
        cp '$work/dist/otelcol-torchdist' '$BIN/otelcol-torchdist'"
    stamp "${inputs[@]}" > "$BIN/otelcol-torchdist.stamp"
    rm -rf "$work"
}

build_tool() {  # build_tool DIR NAME PACKAGE: a program pinned by DIR/go.mod (a module with a tool directive)
    local dir="$HERE/$1" name="$2" package="$3"
    local inputs=("$dir/go.mod" "$dir/go.sum")
    if fresh "$name" "${inputs[@]}"; then echo "build-stack: $name is up to date"; return; fi
    timed "$name" bash -c "cd '$dir' && go build -trimpath -o '$BIN/$name' '$package'"
    stamp "${inputs[@]}" > "$BIN/$name.stamp"
}

what="${1:-all}"
case "$what" in
    otelcol|all) build_otelcol ;;&
    jaeger|all) build_tool jaeger jaeger github.com/jaegertracing/jaeger/cmd/jaeger ;;&
    prometheus|all)
        build_tool prometheus prometheus github.com/prometheus/prometheus/cmd/prometheus
        build_tool prometheus promtool github.com/prometheus/prometheus/cmd/promtool ;;
    otelcol|jaeger) ;;
    *) echo "build-stack: unknown component '$what' (otelcol, jaeger, prometheus, or nothing for all)" >&2; exit 2 ;;
esac
