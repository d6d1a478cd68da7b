#!/usr/bin/env bash
# schema-sdl.sh prints the API's schema as one document, as graph.SchemaSDL
# builds it: graph/schema.graphqls, then the other graph/*.graphqls in name
# order, each ending in a newline. `make generate` writes it to
# sdk/schema.graphql, the file tenants generate their clients from.
set -euo pipefail
cd "$(dirname "$0")/.."
export LC_ALL=C
for f in graph/schema.graphqls $(ls graph/*.graphqls | grep -v '^graph/schema.graphqls$' | sort); do
  cat "$f"
  [ -z "$(tail -c1 "$f")" ] || echo
done
