#!/bin/sh
# Appends of several processes combined under one holder of the ordering
# lock: a prototype, measured against the shipped code (docs/benchmarks.md,
# "Appends of several processes combined under one lock holder").
#
# prototype.patch applies to 9bccb14 (and later commits that leave
# eventstore/batchwire.go and eventstore/groupcommit.go as they were): a
# migration with an unlogged request queue and answers table, append_enqueue
# and append_combined, and a client that sends every group as
# append_enqueue, Sync, append_combined, Sync in one pipeline when
# ANNALS_PROTO_COMBINE=1.
#
# Usage, on a throwaway cluster with fsync on:
#   annals dev -- bench/combine/run.sh [PAIRS]
set -eu
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/tree" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$root" worktree add -q --detach "$work/tree" HEAD
git -C "$work/tree" apply "$root/bench/combine/prototype.patch"
(cd "$root/bench/peers" && go build -o "$work/shipped" .)
(cd "$work/tree/bench/peers" && go build -o "$work/combine" .)
for i in $(seq "${1:-2}"); do
	echo "== shipped, pair $i"
	"$work/shipped" --workloads 4px4x1 --contenders annals,raw --rounds 1 2>&1 | grep -E '^\| 4 proc'
	echo "== combined, pair $i"
	ANNALS_PROTO_COMBINE=1 "$work/combine" --workloads 4px4x1 --contenders annals,raw --rounds 1 2>&1 | grep -E '^\| 4 proc'
done
