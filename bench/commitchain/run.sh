#!/usr/bin/env bash
# The commit-chain prototype (setup.sql) beside annals' append_batch and raw
# INSERTs, with pgbench, in one run: docs/benchmarks.md, "The commit chain".
#
#   annals dev -- bench/commitchain/run.sh [seconds] [rounds]
#
# Speed: the 4 processes × 4 writers shape (raw: 16 clients inserting one
# row per transaction; annals and the chain: 4 clients each sending groups of
# four single-event appends, as four processes' group commit does) and the
# 4 writers × 100 events shape (4 clients, one 100-event append or 100-row
# INSERT per transaction), rounds interleaved, events/s.
#
# Order: a tailing reader records, many times a second, the head it sees and
# how many events it sees at or below it, while 8 clients append groups of
# four, sleeping up to 2 ms before COMMIT and rolling back one transaction in
# ten. Afterwards every observation is checked against the table: an event
# at or below a head that was seen, but not seen with it, committed after a
# higher position was visible, and a reader paging by position skipped it.
# The raw table (bigserial, no ordering) is checked the same way, to show
# that the check finds such events where they happen.
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-4}
rounds=${2:-3}
: "${DATABASE_URL:?DATABASE_URL must be set}"
PGOPTIONS="-c client_min_messages=warning" psql -q -X "$DATABASE_URL" -f setup.sql
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
payload='{"amount":1,"currency":"EUR","note":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'

printf '%s\n' '\set r random(1, 1000000000000)' \
	"INSERT INTO chain.raw_events (event_id, stream_id, stream_version, event_type, data) VALUES (gen_random_uuid(), 's' || :r, 1, 'bench.deposited', '$payload');" >"$dir/raw1.sql"
printf '%s\n' '\set r random(1, 1000000000000)' \
	"INSERT INTO chain.raw_events (event_id, stream_id, stream_version, event_type, data) SELECT gen_random_uuid(), 's' || :r, g, 'bench.deposited', '$payload' FROM generate_series(1, 100) g;" >"$dir/raw100.sql"

# group FUNCTION: four single-event appends to new streams.
group() {
	local fn=$1 extra=$2
	printf '%s\n' '\set r random(1, 1000000000000)' \
		"SELECT count(*) FROM $fn(ARRAY['s' || :r || '-1', 's' || :r || '-2', 's' || :r || '-3', 's' || :r || '-4'], ARRAY[0, 0, 0, 0]::bigint[], ARRAY[1, 2, 3, 4], ARRAY[1, 1, 1, 1], ARRAY[gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), gen_random_uuid()], array_fill('bench.deposited'::text, ARRAY[4]), array_fill('$payload'::text, ARRAY[4]), array_fill(NULL::text, ARRAY[4])$extra);"
}
# large FUNCTION: one append of 100 events to a new stream.
large() {
	local fn=$1 extra=$2 g="generate_series(1, 100) g"
	printf '%s\n' '\set r random(1, 1000000000000)' \
		"SELECT count(*) FROM $fn(ARRAY['s' || :r], ARRAY[0]::bigint[], array_fill(1, ARRAY[100]), (SELECT array_agg(g) FROM $g), (SELECT array_agg(gen_random_uuid()) FROM $g), array_fill('bench.deposited'::text, ARRAY[100]), array_fill('$payload'::text, ARRAY[100]), array_fill(NULL::text, ARRAY[100])$extra);"
}
group annals.append_batch ", false" >"$dir/annals4.sql"
group chain.append_batch "" >"$dir/chain4.sql"
large annals.append_batch ", false" >"$dir/annals100.sql"
large chain.append_batch "" >"$dir/chain100.sql"

# tps CLIENTS SCRIPT: transactions per second.
tps() { pgbench -n -M prepared -c "$1" -j 2 -T "$secs" -f "$dir/$2.sql" "$DATABASE_URL" 2>&1 | awk '/^tps/ {print $3}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

for round in $(seq 1 "$rounds"); do
	psql -q -X "$DATABASE_URL" -c "TRUNCATE chain.raw_events, chain.events, chain.streams; CHECKPOINT"
	raw=$(awk -v t="$(tps 16 raw1)" 'BEGIN { print t }')
	ann=$(awk -v t="$(tps 4 annals4)" 'BEGIN { print t * 4 }')
	chn=$(awk -v t="$(tps 4 chain4)" 'BEGIN { print t * 4 }')
	echo "round $round, 4 processes x 4 writers, events/s: raw $raw, annals $ann ($(ratio "$ann" "$raw")x raw), chain $chn ($(ratio "$chn" "$raw")x raw, $(ratio "$chn" "$ann")x annals)"
	raw=$(awk -v t="$(tps 4 raw100)" 'BEGIN { print t * 100 }')
	ann=$(awk -v t="$(tps 4 annals100)" 'BEGIN { print t * 100 }')
	chn=$(awk -v t="$(tps 4 chain100)" 'BEGIN { print t * 100 }')
	echo "round $round, 4 writers x 100 events, events/s: raw $raw, annals $ann ($(ratio "$ann" "$raw")x raw), chain $chn ($(ratio "$chn" "$raw")x raw, $(ratio "$chn" "$ann")x annals)"
done

# The order check.
{
	echo '\set r random(1, 1000000000000)'
	echo '\set d random(0, 2000)'
	echo '\set rb random(0, 9)'
	echo 'BEGIN;'
	group chain.append_batch "" | tail -n 1
	echo '\sleep :d us'
	echo '\if :rb = 0'
	echo 'ROLLBACK;'
	echo '\else'
	echo 'COMMIT;'
	echo '\endif'
} >"$dir/chainrb.sql"
{
	echo '\set r random(1, 1000000000000)'
	echo '\set d random(0, 2000)'
	echo 'BEGIN;'
	tail -n 1 "$dir/raw1.sql"
	echo '\sleep :d us'
	echo 'COMMIT;'
} >"$dir/rawrb.sql"
printf '%s\n' 'INSERT INTO chain.seen SELECT coalesce(max(global_sequence), 0), count(*) FROM chain.events;' >"$dir/seechain.sql"
printf '%s\n' 'INSERT INTO chain.seen SELECT coalesce(max(global_sequence), 0), count(*) FROM chain.raw_events;' >"$dir/seeraw.sql"
check() {
	local table=$1 writers=$2 reader=$3
	psql -q -X "$DATABASE_URL" -c "TRUNCATE chain.raw_events, chain.events, chain.streams, chain.seen"
	pgbench -n -M prepared -c 1 -T "$secs" -f "$dir/$reader.sql" "$DATABASE_URL" >/dev/null 2>&1 &
	local rd=$!
	pgbench -n -M prepared -c 8 -j 2 -T "$secs" -f "$dir/$writers.sql" "$DATABASE_URL" >/dev/null 2>&1
	wait "$rd"
	psql -X -At "$DATABASE_URL" -c "SELECT count(*) || ' observations, ' || count(*) FILTER (WHERE late > 0) || ' with events that became visible later below the head seen ('
		|| coalesce(sum(late), 0) || ' such sightings); ' || (SELECT count(*) FROM chain.$table) || ' events committed'
		FROM (SELECT s.h, (SELECT count(*) FROM chain.$table e WHERE e.global_sequence <= s.h) - s.c AS late FROM chain.seen s) x"
}
echo "order, chain (8 writers of groups of 4, delays, 10% rolled back): $(check events chainrb seechain)"
echo "order, raw bigserial INSERT (8 writers, delays), the check's control: $(check raw_events rawrb seeraw)"
