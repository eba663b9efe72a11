# kubefence — see README.md. `make test` is what CI runs (via .ci/run).
SHELL := /bin/bash
GO ?= go
BIN_DIR ?= bin
KUBEFENCE := $(BIN_DIR)/kubefence
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/kubefence/kubefence/internal/version.Version=$(VERSION)
# How long `make fuzz` (part of `make test`) runs each target: a count of inputs, not a duration.
# Go 1.26's fuzzing coordinator can fail a target with "context deadline exceeded" when a
# duration's deadline fires while a worker is mid-input on a busy machine (golang/go#75804, fixed
# in Go 1.27), which failed CI once with nothing found; a count has no deadline to race.
FUZZTIME ?= 60000x
# Where hack/e2e-deps.sh puts the binaries it gets, found the way it finds it.
DEPS_BIN := $(or $(KUBEFENCE_BIN_DIR),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/kubefence/bin)

.PHONY: all build static e2e-deps bench-deps test unit e2e fuzz vet fmt-check alerts-check demo bench-proxy bench-cutover bench-migrate clean
# One target at a time, also under make -j: hack/e2e-deps.sh's runs (e2e-deps, alerts-check)
# would race for apt's lock, and the timing checks of unit, fuzz and e2e share the cores.
.NOTPARALLEL:

all: build

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(KUBEFENCE) ./cmd/kubefence

# A static binary (no cgo), as shipped in images.
static:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w $(LDFLAGS)' -o $(BIN_DIR)/kubefence-static ./cmd/kubefence
	@command -v ldd >/dev/null || { echo "static: ldd not found; it is what checks $(BIN_DIR)/kubefence-static is static (install libc-bin)"; exit 1; }
	@if ldd $(BIN_DIR)/kubefence-static >/dev/null 2>&1; then echo "$(BIN_DIR)/kubefence-static is dynamically linked"; exit 1; fi
	@$(BIN_DIR)/kubefence-static version

# Installs etcd 3.4 (Debian), builds etcd 3.5/3.6 and kube-apiserver/kubectl 1.36 into the cache,
# and puts promtool there (out of Debian's prometheus package, not installed).
e2e-deps:
	bash hack/e2e-deps.sh

bench-deps:
	bash hack/e2e-deps.sh --bench

# The whole suite: static checks, the alerting rules' tests, unit tests with -race, a short fuzz
# run, and the e2e tests.
test: e2e-deps vet fmt-check alerts-check unit fuzz e2e

vet:
	$(GO) vet ./...
	$(GO) vet -tags e2e ./e2e/...

# The files git tracks; without git (a tarball) or with none listed it fails rather than check
# nothing (gofmt -l with no file reads stdin).
fmt-check:
	@files=$$(git ls-files '*.go') && [ -n "$$files" ] || { echo "fmt-check: git ls-files listed no Go files (not a git checkout?)"; exit 1; }; \
	out=$$(gofmt -l $$files); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# The alerting rules shipped in deploy/prometheus/: promtool checks them and runs their tests
# (the unit test TestAlertRulesNameRealMetrics checks they read metrics the proxy exports).
# It gets only promtool (hack/e2e-deps.sh --promtool), not the e2e binaries.
alerts-check:
	bash hack/e2e-deps.sh --promtool
	"$(DEPS_BIN)/promtool" check rules deploy/prometheus/kubefence-alerts.yaml
	"$(DEPS_BIN)/promtool" test rules deploy/prometheus/kubefence-alerts.test.yaml

# Depends on e2e-deps: some unit tests run the etcd 3.4 it puts in place (and fail without it
# under CI). -count=1: a pass cached from an earlier run proves nothing about this one.
unit: e2e-deps
	$(GO) test -race -count=1 ./...

fuzz:
	$(GO) test ./policy/ -run '^$$' -fuzz FuzzClassify -fuzztime $(FUZZTIME)
	$(GO) test ./migrator/v2v3/ -run '^$$' -fuzz FuzzUnescape -fuzztime $(FUZZTIME)

# -p 1: one package at a time. The demo's test (e2e/demo) and the e2e package both assert timing
# (leases kept, no writer error through a window); run side by side they share the cores.
e2e: e2e-deps
	$(GO) test -race -tags e2e -count=1 -p 1 -timeout 30m ./e2e/...

# The main job, locally: see README.md. KEEP=1 leaves it running; MANUAL=1 stops before the
# cutover so that you can run it by hand (docs/runbook.md).
# Built, then exec'd, so that a signal to make's shell reaches the demo itself (go run would
# exit and leave it running without a parent).
demo: e2e-deps build
	$(GO) build -o $(BIN_DIR)/demo ./e2e/demo
	exec $(BIN_DIR)/demo --kubefence $(KUBEFENCE) $(if $(KEEP),--keep) $(if $(MANUAL),--manual) $(if $(OBJECTS),--objects $(OBJECTS)) $(if $(WRITE_RATE),--write-rate $(WRITE_RATE))

# Proxy throughput and latency: direct, kubefence, HAProxy; see docs/benchmarks.md.
# The benches are built, then exec'd, as the demo is: go run would leave one running without a
# parent when make is signalled.
bench-proxy: bench-deps build
	$(GO) build -o $(BIN_DIR)/bench-proxy ./e2e/bench/proxy
	exec $(BIN_DIR)/bench-proxy --kubefence $(KUBEFENCE)

clean:
	rm -rf $(BIN_DIR)

# Cutover write-unavailability window (and the rollback's) at 1k/10k/50k/200k objects, or
# OBJECTS=1000,50000 WRITE_RATES=0,200 RUNS=3 WATCHES=500 QUIET_WATCHES=500; see docs/benchmarks.md.
bench-cutover: e2e-deps build
	$(GO) build -o $(BIN_DIR)/bench-cutover ./e2e/bench/cutover
	exec $(BIN_DIR)/bench-cutover --kubefence $(KUBEFENCE) $(if $(OBJECTS),-objects $(OBJECTS)) $(if $(WRITE_RATES),-write-rates $(WRITE_RATES)) $(if $(RUNS),-runs $(RUNS)) $(if $(WATCHES),-watches $(WATCHES)) $(if $(QUIET_WATCHES),-quiet-watches $(QUIET_WATCHES))

# v2 -> v3 migration: kubefence vs etcdctl migrate, wall time and peak RSS. KEYS=1000000 by
# default (generating that store takes ~20 minutes the first time; it is cached).
bench-migrate: e2e-deps build
	$(GO) build -o $(BIN_DIR)/bench-migrate ./e2e/bench/migrate
	exec $(BIN_DIR)/bench-migrate --kubefence $(KUBEFENCE) $(if $(KEYS),--keys $(KEYS))
