#!/usr/bin/env bash
# Builds the composer binary of a given commit into bin/composer-<sha>
# (once; later calls reuse it) and prints its path. `make bench` compares
# the current binary with it. The commit is checked out in a temporary
# worktree, so the working tree is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: scripts/baseline-binary.sh <commit>}
sha=$(git rev-parse --short=12 "$rev^{commit}")
out="bin/composer-$sha"
if [ ! -x "$out" ]; then
  mkdir -p bin
  tmp=$(mktemp -d)
  trap 'git worktree remove --force "$tmp/src" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
  git worktree add --detach "$tmp/src" "$sha" >/dev/null 2>&1
  (cd "$tmp/src" && go build -o "$OLDPWD/$out.tmp" ./cmd/composer)
  mv "$out.tmp" "$out"
fi
echo "$out"
