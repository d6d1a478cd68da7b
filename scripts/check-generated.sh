#!/usr/bin/env bash
# check-generated.sh fails when the committed gqlgen output is not what
# `make generate` would write from the current schema.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
generated=(graph/generated.go graph/model/models_gen.go)
for f in "${generated[@]}"; do mkdir -p "$tmp/$(dirname "$f")"; cp "$f" "$tmp/$f"; done
# Resolver files are regenerated too (gqlgen keeps their bodies); keep them.
resolvers=$(ls graph/*.resolvers.go 2>/dev/null || true)
for f in $resolvers; do mkdir -p "$tmp/keep/graph"; cp "$f" "$tmp/keep/$f"; done
go tool gqlgen generate >/dev/null
status=0
for f in "${generated[@]}"; do
  if ! cmp -s "$f" "$tmp/$f"; then
    echo "$f is stale: run 'make generate' and commit the result" >&2
    status=1
    cp "$tmp/$f" "$f"
  fi
done
for f in $resolvers; do cp "$tmp/keep/$f" "$f"; done
exit $status
