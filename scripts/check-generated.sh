#!/usr/bin/env bash
# check-generated.sh fails when the committed generated code — gqlgen's,
# the published schema and the SDK's genqlient client — is not what
# `make generate` would write from the current schema. It regenerates into
# the working tree and always puts every file back as it was.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
files=(graph/generated.go graph/model/models_gen.go $(ls graph/*.resolvers.go 2>/dev/null) sdk/schema.graphql sdk/client/generated.go)
for f in "${files[@]}"; do mkdir -p "$tmp/orig/$(dirname "$f")"; cp "$f" "$tmp/orig/$f"; done
restore() {
  for f in "${files[@]}"; do cp "$tmp/orig/$f" "$f"; done
  rm -rf "$tmp"
}
trap restore EXIT
if ! go tool gqlgen generate >"$tmp/gen.log" 2>&1; then
  echo "gqlgen generate failed:" >&2
  cat "$tmp/gen.log" >&2
  exit 1
fi
bash scripts/schema-sdl.sh > sdk/schema.graphql
if ! go tool genqlient sdk/client/genqlient.yaml >"$tmp/genq.log" 2>&1; then
  echo "genqlient failed:" >&2
  cat "$tmp/genq.log" >&2
  exit 1
fi
status=0
for f in graph/generated.go graph/model/models_gen.go sdk/schema.graphql sdk/client/generated.go; do
  if ! cmp -s "$f" "$tmp/orig/$f"; then
    echo "$f is stale: run 'make generate' and commit the result" >&2
    status=1
  fi
done
exit $status
