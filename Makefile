# spotguard — run `make help` for the targets.
GOLANGCI_LINT_VERSION := v2.15.0
BIN := bin/spotguard
SOAK ?= 10m
VERSION ?= $(shell git -c safe.directory='$(CURDIR)' describe --tags --always --dirty 2>/dev/null || echo dev)
# A Debian version: v1.2.0-3-gabc → 1.2.0+3+gabc; without a tag, 0.0.0+git<hash>.
DEB_VERSION ?= $(shell echo '$(VERSION)' | sed -E -e 's/^v?([0-9]+\.[0-9])/\1/' -e 't done' -e 's/^/0.0.0+git/' -e ':done' -e 's/-/+/g')
DEB_ARCH ?= $(shell go env GOARCH)
# go-nvml wraps NVML calls that NVML 13 deprecates, so its cgo build prints about 150 lines of C
# warnings (-Wdeprecated-declarations) the first time it is compiled. Silence them for every go
# command run from here; "-O2 -g" is Go's default, kept. A CGO_CFLAGS from the environment wins.
CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
export CGO_CFLAGS

.PHONY: demo help build test test-unit test-e2e bench bench-s3 bench-scale soak lint fuzz tools clean install uninstall deb

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## build bin/spotguard
	go build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/spotguard

tools: ## build the pinned test peers (ec2-metadata-mock, versitygw) into bin/
	GOBIN=$(CURDIR)/bin go -C test/tools install tool

test: tools ## the whole suite, as CI runs it: vet, race tests (end-to-end included), fuzz seeds
	./test/run-all.sh

test-unit: ## unit tests only (no peers needed)
	go vet ./...
	go test -race -count=1 $$(go list ./... | grep -v /test/)

test-e2e: tools build ## end-to-end tests against the real IMDS simulator and real processes
	PATH=$(CURDIR)/bin:$$PATH go test -race -count=1 -v ./test/e2e/

bench: tools ## benchmarks: detection-to-signal latency and idle cost (takes about 2 minutes)
	PATH=$(CURDIR)/bin:$$PATH go test -run '^$$' -bench . -benchtime 1x -timeout 10m ./test/e2e/

bench-s3: tools ## spotguard vs awscli: upload, restore on loopback HTTP, TLS and the scaled model of S3; time to durable on the model (BENCH_CKPT_MIB, default 1024; docs/benchmarks.md)
	PATH=$(CURDIR)/bin:$$PATH go test -v -run '^$$' -bench 'S3Model' -benchtime 1x -timeout 60m ./test/e2e/

bench-scale: ## I8 benchmarks: commit of 1k/10k/100k files, start-up with 100/1000 commits, watcher (tmpfs when there is one)
	TMPDIR=$$( [ -d /dev/shm ] && echo /dev/shm || echo $${TMPDIR:-/tmp} ) go test -run '^$$' \
		-bench 'BenchmarkCommitManyFiles|BenchmarkStartupWithCommitted|BenchmarkWatcherManyFiles' -benchtime 1x -timeout 30m ./checkpoint/

soak: tools ## the seeded soak for SOAK (default 10m): real agent killed and restarted, checked against the store; SPOTGUARD_SOAK_SEED=N replays
	SPOTGUARD_SOAK=$(SOAK) PATH=$(CURDIR)/bin:$$PATH go test -count=1 -run TestSoak -v -timeout 0 ./test/e2e/

fuzz: ## run every parser fuzzer for FUZZTIME each (default 100000x inputs; a duration such as 10s works too)
	./test/fuzz.sh $${FUZZTIME:-100000x}

lint: ## golangci-lint, pinned
	go run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION) run ./...

install: build ## build, then install bin/spotguard, the systemd units and a default config (DESTDIR=/path to stage)
	DESTDIR="$(DESTDIR)" ./systemd/install.sh --binary $(BIN)

uninstall: ## stop, disable and remove what `make install` put there (an edited config stays)
	DESTDIR="$(DESTDIR)" ./systemd/install.sh --uninstall

deb: build ## dist/spotguard_<version>_<arch>.deb (nfpm, pinned in test/tools/deb/go.mod)
	@# The binary must be the cgo build (GPU support), and the glibc it needs no newer than the
	@# package's Depends: libc6 (>= V) in systemd/nfpm.yaml says.
	@command -v objdump >/dev/null || { echo "make deb: objdump not found (Debian package binutils, which gcc pulls in)" >&2; exit 1; }
	@libc=$$(sed -n 's/^ *- libc6 (>= \([0-9.]*\))$$/\1/p' systemd/nfpm.yaml); \
	need=$$(objdump -T $(BIN) 2>/dev/null | sed -n 's/.*GLIBC_\([0-9][0-9.]*\).*/\1/p' | sort -uV | tail -n 1); \
	if [ -z "$$need" ]; then \
		echo "make deb: $(BIN) links no glibc: it was built without cgo (no gcc, or CGO_ENABLED=0) and has no GPU support; install gcc and run make deb again" >&2; exit 1; \
	fi; \
	if [ -z "$$libc" ] || [ "$$(printf '%s\n' "$$need" "$$libc" | sort -V | tail -n 1)" != "$$libc" ]; then \
		echo "make deb: $(BIN) needs glibc $$need, newer than the package's Depends: libc6 (>= $$libc) in systemd/nfpm.yaml: build where glibc is older, or raise it there" >&2; exit 1; \
	fi; \
	echo "$(BIN) needs glibc $$need; the package depends on libc6 (>= $$libc)"
	mkdir -p dist/deb
	cp $(BIN) dist/deb/spotguard
	for u in spotguard.service spotguard-restore.service; do \
		sed 's#/usr/local/bin/spotguard#/usr/bin/spotguard#g' systemd/$$u > dist/deb/$$u; done
	DEB_VERSION=$(DEB_VERSION) DEB_ARCH=$(DEB_ARCH) go tool -modfile=test/tools/deb/go.mod nfpm package \
		--config systemd/nfpm.yaml --packager deb --target dist/spotguard_$(DEB_VERSION)_$(DEB_ARCH).deb

clean: ## remove build output
	rm -rf bin dist

demo: ## run the notice path locally: IMDS simulator → spotguard → example trainer
	./examples/local-demo.sh
