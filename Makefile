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
TEST_FLAGS  ?= -race -count=1 -timeout 30m
BENCH_FLAGS ?=
PEERS_FLAGS ?=

.PHONY: all test vet demo bench bench-peers postgres build fmt

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

vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	cd annalstest/pgcontainer && $(GO) vet ./...

# annalstest/pgcontainer is a module of its own (it keeps testcontainers and
# the Docker client out of the library's go.mod); its tests need no cluster.
test: vet
	@$(MAKE) --no-print-directory chromium
	cd annalstest/pgcontainer && $(GO) test $(TEST_FLAGS) ./...
ifdef ANNALS_TEST_DATABASE_URL
	$(GO) test $(TEST_FLAGS) ./...
else
	@$(MAKE) --no-print-directory postgres
	$(ANNALS) dev --fsync=false -- $(GO) test $(TEST_FLAGS) ./...
endif

# demo: the bank service end to end (examples/bank: aggregate commands, events,
# a live projection and observer, a rebuild); on a throwaway cluster the
# quickstart runs first. The quickstart writes fixed streams, so it needs a
# fresh database and is left out with DATABASE_URL; the bank demo can run
# again on the same database.
demo:
ifdef DATABASE_URL
	$(GO) run ./examples/bank demo
else
	@$(MAKE) --no-print-directory postgres
	$(ANNALS) dev -- sh -c '$(GO) run ./examples/quickstart && echo && $(GO) run ./examples/bank demo'
endif

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
