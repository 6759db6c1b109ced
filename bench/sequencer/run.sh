#!/usr/bin/env bash
# Sequencer prototype vs raw INSERT, 16 clients, one run (see docs/architecture.md).
# Usage: DATABASE_URL=... bench/sequencer/run.sh [seconds]
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-5}
PGOPTIONS="-c client_min_messages=warning" psql -q -X "$DATABASE_URL" -f setup.sql
for round in 1 2 3; do
	raw=$(pgbench -n -M prepared -c 16 -j 2 -T "$secs" -f raw.sql "$DATABASE_URL" | awk '/^tps/ {print int($3)}')
	pgbench -n -M prepared -c 1 -T "$((secs + 1))" -f sequencer.sql "$DATABASE_URL" >/dev/null &
	seqpid=$!
	seq=$(pgbench -n -M prepared -c 16 -j 2 -T "$secs" -f writer.sql "$DATABASE_URL" | awk '/^tps/ {print int($3)}')
	wait "$seqpid"
	left=$(psql -X -At "$DATABASE_URL" -c "SELECT count(*) FROM seqproto.events WHERE global_sequence IS NULL")
	echo "round $round: raw insert ${raw}/s, sequencer writers ${seq}/s ($(awk "BEGIN {printf \"%.2f\", $seq/$raw}")x), unpositioned at the end: $left"
done
