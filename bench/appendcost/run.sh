#!/usr/bin/env bash
# Backend CPU per call of single-event appends, and the rate of 4 clients
# sending groups of 4: the figures of docs/benchmarks.md, "CPU per event".
# Runs pgbench against DATABASE_URL, whose server must run on this machine
# (the backend's CPU time is read from /proc) with the annals schema
# migrated:
#
#   annals dev -- bench/appendcost/run.sh [seconds]
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-3}
: "${DATABASE_URL:?DATABASE_URL must be set}"
PGOPTIONS="-c client_min_messages=warning" psql -q -X "$DATABASE_URL" -f setup.sql
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
payload='{"amount":1,"currency":"EUR","note":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'
printf '%s\n' '\set r random(1, 1000000000000)' \
	"INSERT INTO appendcost.raw_events (event_id, stream_id, stream_version, event_type, data) VALUES (gen_random_uuid(), 's' || :r, 1, 'bench.deposited', '$payload');" >"$dir/raw.sql"
printf '%s\n' '\set r random(1, 1000000000000)' \
	"SELECT appendcost.minimal('s' || :r, gen_random_uuid(), '$payload');" >"$dir/minimal.sql"
printf '%s\n' '\set r random(1, 1000000000000)' \
	"SELECT appendcost.lean('s' || :r, 0, gen_random_uuid(), 'bench.deposited', '$payload');" >"$dir/lean.sql"
printf '%s\n' '\set r random(1, 1000000000000)' \
	"SELECT appendcost.definer('s' || :r, gen_random_uuid(), 'bench.deposited', '$payload');" >"$dir/definer.sql"
# append_one (what the Go client sends for a lone single-event append), with
# a caller-chosen event ID (the idempotency probe runs) and without.
printf '%s\n' '\set r random(1, 1000000000000)' \
	"SELECT status FROM annals.append_one('s' || :r, 0, gen_random_uuid(), 'bench.deposited', '$payload', NULL, true);" >"$dir/one.sql"
printf '%s\n' '\set r random(1, 1000000000000)' \
	"SELECT status FROM annals.append_one('s' || :r, 0, gen_random_uuid(), 'bench.deposited', '$payload', NULL, false);" >"$dir/one_noprobe.sql"
# append_one to one stream that grows (expected version any: the UPDATE of
# its streams row), as annals bench's single writer appends, with a
# generated ID. One stream per run: pgbench's :client_id is 0 in every run.
printf '%s\n' "SELECT status FROM annals.append_one('grow-$$-$RANDOM', NULL, gen_random_uuid(), 'bench.deposited', '$payload', NULL, false);" >"$dir/one_grow.sql"
# append_batch with n single-event appends, each to a new stream, with
# caller-chosen event IDs (the idempotency probe runs), as the Go client
# sends a group.
batch() {
	local n=$1 streams="" expected="" appends="" index="" ids="" types="" data="" meta=""
	for i in $(seq 1 "$n"); do
		sep=$([ "$i" -gt 1 ] && echo , || true)
		streams+="$sep's' || :r || '-$i'"; expected+="${sep}0"; appends+="$sep$i"; index+="${sep}1"
		ids+="${sep}gen_random_uuid()"; types+="$sep'bench.deposited'"; data+="$sep'$payload'"; meta+="${sep}NULL"
	done
	printf '%s\n' '\set r random(1, 1000000000000)' \
		"SELECT count(*) FROM annals.append_batch(ARRAY[$streams], ARRAY[$expected]::bigint[], ARRAY[$appends], ARRAY[$index], ARRAY[$ids], ARRAY[$types], ARRAY[$data], ARRAY[$meta]::text[], true);" >"$dir/batch$n.sql"
}
batch 1
batch 4
batch 16
# large CHECK: append_batch with 4 appends of 100 events each, each to a new
# stream, with check_ids CHECK: since migration 0020 a call this large with
# caller-chosen IDs does not look them up first, so true and false cost the
# same (the look-up cost about 1 ms of the call before).
large() {
	local g="generate_series(1, 400) g"
	printf '%s\n' '\set r random(1, 1000000000000)' \
		"SELECT count(*) FROM annals.append_batch(ARRAY['s' || :r || '-1', 's' || :r || '-2', 's' || :r || '-3', 's' || :r || '-4'], ARRAY[0, 0, 0, 0]::bigint[], (SELECT array_agg((g - 1) / 100 + 1) FROM $g), (SELECT array_agg((g - 1) % 100 + 1) FROM $g), (SELECT array_agg(gen_random_uuid()) FROM $g), array_fill('bench.deposited'::text, ARRAY[400]), array_fill('$payload'::text, ARRAY[400]), array_fill(NULL::text, ARRAY[400]), $1);" >"$dir/large_$1.sql"
}
large true
large false
. ./cpu.sh
for round in 1 2; do
	echo "round $round"
	for s in raw definer minimal lean one one_noprobe one_grow batch1 batch4 batch16 large_true large_false; do cpu "$s"; done
	tps=$(pgbench -n -M prepared -c 4 -j 2 -T "$secs" -f "$dir/batch4.sql" "$DATABASE_URL" | awk '/^tps/ {print int($3)}')
	echo "4 clients x groups of 4: $tps groups/s ($((tps * 4)) appends/s)"
done
