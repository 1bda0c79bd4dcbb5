# shardvisor — see README.md. Every target works on a fresh machine with Go:
# scripts/devenv installs ZooKeeper and PostgreSQL when they are missing.

GO       ?= go
PKGS     ?= ./...
# The longest packages first: go test starts packages in the order given,
# so the longest ones (60-200 s each on 2 cores) run beside the rest
# instead of after it, and the 30-second ones before the short ones,
# which fill the end.
# internal/archtest (static checks of the source, no goroutines of its
# own) runs without -race beside the rest: under -race its type-checking
# of the whole module took 42 s of a CPU that the others wait for.
ARCHTEST  = ./internal/archtest/
TEST_PKGS ?= ./migrate/ ./supervisor/ ./cmd/shardctl/ ./internal/devenv/ ./clients/python/ ./cmd/supervisor/ ./gc/ ./sidecar/ ./internal/testenv/ ./topo/ ./zksession/ \
	$(filter-out %/internal/archtest,$(shell $(GO) list $(PKGS) 2>/dev/null))
# -race everywhere else: most packages run goroutines. -p 2 matches the
# 2-core machines; integration tests share one ensemble and isolate by
# path/db. -vet=off: lint has run all of go vet already.
TESTFLAGS ?= -race -count=1 -timeout 18m -p 2 -vet=off
# A race-enabled binary sleeps a second before it exits (atexit_sleep_ms,
# 1000 by default): 40 test binaries, and every supervisor test's keeper
# process (the test binary again) at each worker's stop. The tests' CPU is
# the machine's, and make test's 5 minutes are counted on it.
export GORACE ?= atexit_sleep_ms=0

.PHONY: all build dist check-rules check-deploy test test-inner test-faults test-faults-inner test-short install-deps bench bench-router bench-supervisor bench-moves bench-tls bench-mapprop bench-fleet bench-pooler bench-restore lint demo demo-down devenv-up devenv-down clean

all: build

# Binaries say their version and commit (--version, shardvisor_build_info):
# this machine's GOFLAGS has -buildvcs=false, so the linker is told.
VERSION_PKG = github.com/shardvisor/shardvisor/internal/version
VERSION    ?= $(shell git describe --tags --always --dirty 2>/dev/null)
REVISION   ?= $(shell git rev-parse HEAD 2>/dev/null)$(if $(shell git status --porcelain --untracked-files=no 2>/dev/null),-dirty)
LDFLAGS     = -X $(VERSION_PKG).Version=$(VERSION) -X $(VERSION_PKG).Revision=$(REVISION)

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/ ./cmd/... ./examples/notes ./examples/notes/loadgen ./examples/hello
	cd examples/embed && $(GO) build -o ../../bin/ ./...

## dist: the release tarball in dist/: binaries, deploy/, the Python sdist
dist:
	scripts/dist dist

## test: all unit and integration tests against real local servers
test: lint install-deps check-rules check-deploy
	scripts/with-devenv $(MAKE) --no-print-directory test-inner

# internal/archtest (no -race) and examples/embed (its own module, no
# servers) run beside the main tests, not after them; their output follows
# theirs, and any one failing fails the target.
test-inner:
	@log=$$(mktemp); { ($(GO) test -count=1 -vet=off $(ARCHTEST) && cd examples/embed && $(GO) test -count=1 ./...) >"$$log" 2>&1; echo $$? >"$$log.rc"; } & \
	  $(GO) test $(TESTFLAGS) $(TEST_PKGS); rc=$$?; wait; \
	  echo "$(GO) test -count=1 $(ARCHTEST) && cd examples/embed && $(GO) test -count=1 ./..."; cat "$$log"; erc=$$(cat "$$log.rc"); rm -f "$$log" "$$log.rc"; \
	  [ $$rc -eq 0 ] && [ "$$erc" = 0 ]

## test-faults: the long fault schedules, which make test leaves out
test-faults: install-deps
	scripts/with-devenv $(MAKE) --no-print-directory test-faults-inner

# A test with a long fault schedule is named TestFaults... and calls
# testenv.Faults(t) first, which skips it unless SHARDVISOR_FAULTS=1 (set
# here); a long scenario without faults is TestLong... with testenv.Long. Tests that make ZooKeeper clients reconnect while holding watches
# run here again without -race: go-zookeeper v1.0.4 races on its own
# lastZxid after such a reconnect, so under -race they skip themselves.
FAULT_TESTS = Faults|Long
RECONNECT_TESTS = LeaderKill|Partition|ZooKeeperLoss
test-faults-inner:
	SHARDVISOR_FAULTS=1 $(GO) test $(TESTFLAGS) -run '$(FAULT_TESTS)' $(PKGS)
	SHARDVISOR_FAULTS=1 $(GO) test -count=1 -timeout 10m -run '$(RECONNECT_TESTS)' ./zksession/ ./topo/ ./fleet/ ./router/ ./sidecar/ ./supervisor/ ./migrate/

## install-deps: Debian packages the tests use (gunicorn, chromium, wrk...)
install-deps:
	scripts/install-deps

## test-short: unit tests only, no servers
test-short:
	$(GO) test -short -count=1 $(PKGS)

## bench: benchmarks; each prints its ratio against its baseline
bench:
	scripts/with-devenv $(GO) test -run '^$$' -bench . -benchmem $(PKGS)

## bench-router: the router sidecar under wrk against a constant handler
bench-router: install-deps
	bench/router/run

## bench-supervisor: gunicorn alone vs the supervisor: reloads and a storm
bench-supervisor: install-deps build
	bench/supervisor/run

## bench-moves: a live rebalance under write load: pauses, copy speed, lost writes
bench-moves:
	bench/moves/run

## bench-tls: bench-moves and the failover bench each run plain then with ZooKeeper over TLS: both, and the ratios TLS/plain
bench-tls:
	bench/moves/run --compare-tls
	bench/failover/run --compare-tls

## bench-pooler: 800 workers on 4 db nodes through PgBouncer: clients against server connections, errors, rows past the fence
bench-pooler:
	bench/pooler/run

## bench-restore: one bucket of 1M rows restored to a restore point: where the time goes (recovery, copy), its pause against a move's
bench-restore:
	scripts/with-devenv go test -count=1 -timeout 30m -run '^$$' -bench RestoreBucket -benchtime 1x ./backup

## bench-mapprop: 100 routers follow a level-16 map: bytes and time per change, plain vs gzip record
bench-mapprop:
	bench/mapprop/run

## bench-fleet: 50 supervisors + 50 routers on a throwaway environment: rebalance (swap vs reload), slow boot, SIGSTOP, isolation, ZooKeeper outage; then bench-mapprop
bench-fleet:
	bench/fleet/run
	bench/mapprop/run

## lint: gofmt and go vet must be clean
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	cd examples/embed && $(GO) vet ./...

## check-rules: the Prometheus rules parse and their promtool unit tests pass (deploy/prometheus)
PROMTOOL ?= promtool
check-rules:
	@command -v $(PROMTOOL) >/dev/null || scripts/install-deps
	$(PROMTOOL) check rules deploy/prometheus/shardvisor.rules.yml deploy/prometheus/shardvisor.recording.yml
	$(PROMTOOL) test rules deploy/prometheus/tests/*.test.yml

## check-deploy: every unit in deploy/systemd passes systemd-analyze verify, with
## its command line and variables checked against the binaries (scripts/check-deploy)
check-deploy:
	scripts/check-deploy

## demo: the main job on the embedded local default (KEEP=1 leaves it up; PROM=1 runs Prometheus beside it with deploy/prometheus's rules)
demo: build
	scripts/demo

## demo-down: stop what `KEEP=1 make demo` left running (Prometheus too, by its pid), and the servers
demo-down:
	scripts/demo down

devenv-up:
	scripts/devenv up

devenv-down:
	scripts/devenv down

clean:
	rm -rf bin
