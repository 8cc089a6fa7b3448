#!/usr/bin/env bash
# The whole test suite: vet, every test with the race detector (end-to-end ones included, against
# the IMDS simulator built by `make tools`), and a short run of every fuzzer.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/bin:$PATH"

echo "== go vet"
go vet ./...
echo "== go test -race"
# The end-to-end package runs its tests one after another, about 10 minutes on 2 cores; the
# timeout leaves room for a slower machine.
go test -race -count=1 -timeout 25m ./...
echo "== fuzz (short)"
./test/fuzz.sh "${FUZZTIME:-30000x}"
