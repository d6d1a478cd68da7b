# Composer — the two commands a newcomer needs are `make run` and `make test`.
# Both prepare local PostgreSQL and Redis first (scripts/services.sh).

SHELL := /bin/bash
GO    ?= go
BIN   := bin/composer
PKGS  := ./...

.PHONY: run test bench generate lint migrate services build tools clean

## services: install/start PostgreSQL and Redis, create roles and the database (idempotent)
services:
	@bash scripts/services.sh

## build: compile the composer binary into bin/
build:
	$(GO) build -o $(BIN) ./cmd/composer

## run: the whole system locally (server, worker, migrations, demo tenant)
run: services build
	COMPOSER_DEV=true ./$(BIN) dev

## test: lint, then the full suite with the race detector against real services
test: services lint
	RAPID_CHECKS=1000 $(GO) test -race -count=1 -timeout 25m $(PKGS)

## bench: the benchmarks (see docs/benchmarks.md): end to end, then the pure core
bench: services build
	./$(BIN) bench -out bench-results.json
	$(GO) test -run '^$$' -bench . -benchmem ./engine/statemachine ./engine/dag ./internal/pguuid

## migrate: apply the migrations to the configured database
migrate: services build
	./$(BIN) migrate

## generate: regenerate gqlgen code from graph/*.graphqls, the published schema and the SDK client
generate:
	$(GO) tool gqlgen generate
	bash scripts/schema-sdl.sh > sdk/schema.graphql
	$(GO) tool genqlient sdk/client/genqlient.yaml

## lint: gofmt, go vet, and generated code up to date
lint:
	@files=$$(git ls-files --cached --others --exclude-standard -- '*.go' | grep -v '/testdata/'); \
	 bad=$$(gofmt -l $$files); \
	 if [ -n "$$bad" ]; then echo "gofmt needed on:"; echo "$$bad"; exit 1; fi
	$(GO) vet $(PKGS)
	@bash scripts/check-generated.sh

clean:
	rm -rf bin
