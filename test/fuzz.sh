#!/usr/bin/env bash
# Runs every Fuzz* target in the module for the given budget each: a count of inputs (default
# 100000x) or a duration (10s). Go 1.26's fuzzing engine can fail a target whose duration runs
# out while a worker is still busy, with a bare "context deadline exceeded" and no failing input
# (golang/go#75804, fixed in Go 1.27): on a loaded machine that happens often enough to redden CI,
# so the budgets here are counts, which set no deadline.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${1:-100000x}
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
    echo "-- $pkg $target ($fuzztime)"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg"
  done
done
