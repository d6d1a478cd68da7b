# Composer — the two commands a newcomer needs are `make run` and `make test`.
# Both prepare local PostgreSQL and Redis first (scripts/services.sh).

SHELL := /bin/bash
GO    ?= go
BIN   := bin/composer
PKGS  := ./...

.PHONY: run test test-cluster bench bench-compare generate lint lint-chart migrate services build tools clean

# The Redis Cluster scripts/services.sh starts, and the packages whose tests
# talk to Redis: `make test-cluster` runs them again on it. (-short leaves
# out the e2e tests that start their own servers, the cluster failover test
# among them, which the main suite runs; the 100,000-task backlog test
# exercises PostgreSQL's sweep, not Redis.)
CLUSTER_URL  ?= redis+cluster://127.0.0.1:7101?addr=127.0.0.1:7102&addr=127.0.0.1:7103
CLUSTER_PKGS := ./engine ./engine/outbox ./engine/stream ./engine/taskpoll ./engine/taskserver ./workers ./tenants ./graph ./e2e
CLUSTER_TEST  = COMPOSER_TEST_REDIS_URL='$(CLUSTER_URL)' $(GO) test -race -count=1 -short -timeout 15m \
	-skip '^TestAWaitingBacklogIsNeverRedispatched$$' $(CLUSTER_PKGS)

## services: install/start PostgreSQL and Redis, create roles and the database (idempotent)
services:
	@bash scripts/services.sh

## build: compile the composer binary into bin/
build:
	$(GO) build -buildvcs=auto -o $(BIN) ./cmd/composer

## run: the whole system locally (server, worker, migrations, demo tenant)
run: services build
	COMPOSER_DEV=true ./$(BIN) dev

## test: lint, then the full suite with the race detector against real services, then
## the Redis-facing packages' tests again on a Redis Cluster (test-cluster)
test: services lint
	RAPID_CHECKS=1000 $(GO) test -race -count=1 -timeout 25m $(PKGS)
	$(CLUSTER_TEST)

## test-cluster: the engine, worker, quota, rate-limit, live-update and e2e tests on the
## local Redis Cluster (3 masters, 3 replicas) that scripts/services.sh starts
test-cluster: services
	$(CLUSTER_TEST)

## bench: the benchmarks (see docs/benchmarks.md). First the step-path scenarios
## (bench.StepPath) with this tree's binary and BENCH_BASELINE's, alternating in
## BENCH_PAIRS ABBA pairs, printing current/baseline ratios (bench-compare.json);
## then every scenario once (bench-results.json); then the pure core and statistics.
## `make bench BENCH_BASELINE=<commit>` compares with another commit.
BENCH_BASELINE ?= 5aa9f31
BENCH_PAIRS    ?= 2
bench: services build
	./$(BIN) bench -baseline "$$(bash scripts/baseline-binary.sh $(BENCH_BASELINE))" -baseline-name $(BENCH_BASELINE) \
		-pairs $(BENCH_PAIRS) -out bench-compare.json
	./$(BIN) bench -out bench-results.json
	$(GO) test -run '^$$' -bench . -benchmem ./engine/statemachine ./engine/dag ./internal/pguuid
	$(GO) test -run '^$$' -bench BenchmarkDashboardStats1M -benchtime 200x -timeout 20m ./stats

## bench-compare: only the alternating comparison (SCENARIOS=a,b to choose; SCALE to shorten)
SCENARIOS ?=
SCALE     ?= 1
bench-compare: services build
	./$(BIN) bench -baseline "$$(bash scripts/baseline-binary.sh $(BENCH_BASELINE))" -baseline-name $(BENCH_BASELINE) \
		-pairs $(BENCH_PAIRS) -scale $(SCALE) $(if $(SCENARIOS),-scenarios $(SCENARIOS)) -out bench-compare.json

## migrate: apply the migrations to the configured database
migrate: services build
	./$(BIN) migrate

## generate: regenerate gqlgen code from graph/*.graphqls, the published schema and the SDK client
generate:
	$(GO) tool gqlgen generate
	bash scripts/schema-sdl.sh > sdk/schema.graphql
	$(GO) tool genqlient sdk/client/genqlient.yaml

## lint: gofmt, go vet, generated code up to date, and the Helm chart rendered and checked
lint:
	@files=$$(git ls-files --cached --others --exclude-standard -- '*.go' | grep -v '/testdata/'); \
	 bad=$$(gofmt -l $$files); \
	 if [ -n "$$bad" ]; then echo "gofmt needed on:"; echo "$$bad"; exit 1; fi
	$(GO) vet $(PKGS)
	@bash scripts/check-generated.sh
	$(MAKE) --no-print-directory lint-chart

## lint-chart: render deploy/helm/composer with Helm's engine (no cluster, no helm binary) and
## check every manifest; a module of its own (deploy/helm/lint), so the main module has no Helm dependency
lint-chart:
	cd deploy/helm/lint && $(GO) vet ./... && $(GO) test -count=1 ./...

clean:
	rm -rf bin
