# annals: the two commands are `make demo` and `make test`.
#
# Both start a throwaway PostgreSQL cluster from the local server binaries
# (installing Debian's postgresql package first when they are missing and we
# run as root), unless a database is given:
#   make demo: DATABASE_URL, if set, is used instead.
#   make test: ANNALS_TEST_DATABASE_URL, if set, is used instead (tests create
#              and drop their own databases on that server).

GO          ?= go
ANNALS      := $(GO) run ./cmd/annals
# -parallel 4: most tests wait (for a lock's timeout, a poll, a child
# process), not compute; at the default (GOMAXPROCS, 2 here) the whole run
# used under one core of two and its go test ./... took 8 min on a fast
# day, 4.9 min at 4 (make test, with vet, the cluster and bench/peers:
# 6.3 min). Tests that measure a pace stay serial (see
# projection/bluegreen_slowcutover_test.go).
TEST_FLAGS  ?= -race -count=1 -parallel 4 -timeout 30m
BENCH_FLAGS ?=
PEERS_FLAGS ?=

.PHONY: all test vet demo demo-build demo-steps demo-next dev bench bench-peers bench-appendcost soak postgres build fmt

all: build

build:
	$(GO) build ./...

postgres:
	@bash scripts/ensure-postgres.sh

# The console's browser test (console/browser_test.go) drives headless
# Chromium; installed like PostgreSQL when missing.
.PHONY: chromium screenshots
chromium:
	@bash scripts/ensure-chromium.sh

# The tests through a transaction-mode pooler (eventstore/pgbouncer_test.go)
# start a real PgBouncer; installed like PostgreSQL when missing.
.PHONY: pgbouncer
pgbouncer:
	@bash scripts/ensure-pgbouncer.sh

vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	cd annalstest/pgcontainer && $(GO) vet ./...
	cd bench/peers && $(GO) vet ./...

# annalstest/pgcontainer is a module of its own (it keeps testcontainers and
# the Docker client out of the library's go.mod); its tests need no cluster.
# bench/peers is one too (watermill-sql stays out of the library's go.mod);
# its smoke test runs every contender and workload of `make bench-peers` for
# a moment (about 25 s), so that the peer benchmark keeps working.
test: vet
	@$(MAKE) --no-print-directory chromium pgbouncer
	cd annalstest/pgcontainer && $(GO) test $(TEST_FLAGS) ./...
ifdef ANNALS_TEST_DATABASE_URL
	$(GO) test $(TEST_FLAGS) ./...
	cd bench/peers && $(GO) test $(TEST_FLAGS) ./...
else
	@$(MAKE) --no-print-directory postgres
	$(ANNALS) dev --fsync=false -- sh -c '$(GO) test $(TEST_FLAGS) ./... && cd bench/peers && $(GO) test $(TEST_FLAGS) ./...'
endif

# demo: annals end to end on a throwaway cluster (or on DATABASE_URL, if set):
# the quickstart (appends, optimistic concurrency, a projection), the bank
# service (aggregates, a live projection and observer, a rebuild) and the
# order saga (timers, a deadline, a late payment refunded). Every step can
# run again on the same database. The binaries are built first, with
# progress (a cold build takes about 20 s). To add a step, append two lines
# to demo-steps.
DEMO_BIN := .demo-bin

demo: demo-build
ifdef DATABASE_URL
	@$(MAKE) --no-print-directory demo-steps
else
	@$(MAKE) --no-print-directory postgres
	@$(DEMO_BIN)/annals dev --fsync=false -- $(MAKE) --no-print-directory demo-steps
endif
	@$(MAKE) --no-print-directory demo-next

demo-build:
	@echo "demo: compiling the annals CLI and the examples (a cold build can take a minute) ..."
	@{ $(GO) build -v -o $(DEMO_BIN)/ ./cmd/annals ./examples/quickstart ./examples/bank ./examples/ordersaga ./examples/relay 2>&1; echo "go-build-exit $$?"; } | \
		awk '/^go-build-exit /{ if (n % 25) printf "  %d packages compiled\n", n; exit $$2 } /^[A-Za-z0-9._\/~-]+$$/{ n++; if (n % 25 == 0) { printf "  %d packages compiled (%s)\n", n, $$0; fflush() } next } { print }'

demo-steps:
	@echo; echo "== quickstart: append, optimistic concurrency, a projection (examples/quickstart)"; echo
	@$(DEMO_BIN)/quickstart
	@echo; echo "== bank: aggregates, a live projection and observer, a rebuild (examples/bank)"; echo
	@$(DEMO_BIN)/bank demo
	@echo; echo "== order saga: timers, a payment deadline, compensation (examples/ordersaga)"; echo
	@$(DEMO_BIN)/ordersaga
	@echo; echo "== relay: the log published exactly once to NATS JetStream, read by another process (examples/relay)"; echo
	@$(DEMO_BIN)/relay

demo-next:
	@echo
	@echo "Next:"
ifndef DATABASE_URL
	@echo "  make dev                     # a local PostgreSQL that stays until Ctrl-C; prints DATABASE_URL=..."
	@echo "  export DATABASE_URL='...'    # in another terminal: the URL make dev printed"
endif
	@echo "  make demo                    # the demo again, on \$$DATABASE_URL"
	@echo "  go run ./cmd/annals status   # subscribers, checkpoints, lag, leaders, timers"
	@echo "  go run ./cmd/annals read --limit 10"
	@echo "  go run ./examples/bank projections list"
	@echo "  go run ./cmd/annals ui --listen 127.0.0.1:8080   # the operator console, read-only without --auth-token"
	@echo "  Your first projection: README.md (Example); how-tos: docs/recipes.md"

# dev: a throwaway PostgreSQL (migrated) that stays until Ctrl-C; it prints
# DATABASE_URL for make demo, the examples and the annals CLI.
dev:
	@$(MAKE) --no-print-directory postgres
	$(ANNALS) dev

# Benchmarks need fsync on: a throwaway cluster with durable commits, or
# DATABASE_URL. Figures go to stdout and bench-results/.
bench:
ifdef DATABASE_URL
	$(ANNALS) bench --json bench-results/bench.json $(BENCH_FLAGS)
	ANNALS_TEST_DATABASE_URL="$(DATABASE_URL)" $(GO) test -run '^$$' -bench . -benchtime 200x ./deadletter/
else
	@$(MAKE) --no-print-directory postgres
	$(ANNALS) dev -- sh -c '$(ANNALS) bench --json bench-results/bench.json $(BENCH_FLAGS) && $(GO) test -run "^$$" -bench . -benchtime 200x ./deadletter/'
endif

# soak: the adversarial tests (chaos, killed leaders and connections,
# crashes and restarts, commits whose answer is lost, concurrent writers,
# replicas starting at once, a REPEATABLE READ default) SOAK_COUNT times each, to find what one make test run hits rarely (a
# race that shows once in many runs). Each chaos test logs its seed. About
# 10 minutes per round on 2 cores; SOAK_TESTS narrows it, e.g.
# make soak SOAK_TESTS=LifecycleChaos SOAK_COUNT=50.
SOAK_COUNT ?= 5
SOAK_TESTS ?= Chaos|Kill|Crash|Restart|CommitAnswerLost|CommitAfterALostCommitLanded|CutoverCommitLost|LostCommitLands|CommitLostBefore|CommitLandsLate|ExactlyOnce|Concurrent|Fencing|ConnectionCut|StartingAtOnce|AtOnce|UnderRepeatableReadDefault|Frozen|IdleHolderKeepsItsLocks|PingsTakeTurns|ALiveEventIsHandledAtOnce|AStopIsPrompt|AStopHandsBack|UnansweredPing|StandbyCountsOnlyStatementsThatRan|StandbyInterruptedWaitsPing|HandlerWorkBeforeItsFirstStatement
SOAK_FLAGS ?= -race -timeout 0 -failfast

soak:
ifdef ANNALS_TEST_DATABASE_URL
	$(GO) test $(SOAK_FLAGS) -count=$(SOAK_COUNT) -run '$(SOAK_TESTS)' ./...
else
	@$(MAKE) --no-print-directory postgres
	$(ANNALS) dev --fsync=false -- sh -c '$(GO) test $(SOAK_FLAGS) -count=$(SOAK_COUNT) -run "$(SOAK_TESTS)" ./...'
endif

# bench-peers: annals beside raw INSERTs and watermill-sql v4 (bench/peers, a
# module of its own so the library gains no peer dependency), fsync on as
# above. Markdown tables to stdout; PEERS_FLAGS='--output json' for JSON.
bench-peers:
ifdef DATABASE_URL
	cd bench/peers && $(GO) run . $(PEERS_FLAGS)
else
	@$(MAKE) --no-print-directory postgres
	$(ANNALS) dev -- sh -c 'cd bench/peers && $(GO) run . $(PEERS_FLAGS)'
endif

# bench-appendcost: the server's CPU time per append call (raw insert, the
# smallest ordered function, append_batch with groups of 1, 4 and 16) with
# pgbench; the server must run on this machine (docs/benchmarks.md, "CPU
# per event").
bench-appendcost:
ifdef DATABASE_URL
	bench/appendcost/run.sh
else
	@$(MAKE) --no-print-directory postgres
	$(ANNALS) dev -- bench/appendcost/run.sh
endif

# screenshots: re-take the console screenshots the README shows
# (docs/screenshots/overview.png and dead-letter.png) with the browser test.
screenshots:
	@$(MAKE) --no-print-directory chromium
ifdef ANNALS_TEST_DATABASE_URL
	ANNALS_SCREENSHOTS=$(CURDIR)/docs/screenshots $(GO) test -count=1 -run '^TestBrowser$$' ./console/
else
	@$(MAKE) --no-print-directory postgres
	$(ANNALS) dev --fsync=false -- env ANNALS_SCREENSHOTS=$(CURDIR)/docs/screenshots $(GO) test -count=1 -run '^TestBrowser$$' ./console/
endif
