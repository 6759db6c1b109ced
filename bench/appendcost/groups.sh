#!/usr/bin/env bash
# Groups of single-event appends: annals.append_batch against the leaner
# prototype of groups.sql, for groups of 1, 4 and 16 appends to streams that
# grow (expected version any), as a process's group commit sends them. For
# each round: the backend's CPU per call (one pgbench client; utime + stime
# from /proc, as run.sh), then 4 clients' calls per second. The server must
# run on this machine with the annals schema migrated:
#
#   annals dev -- bench/appendcost/groups.sh [seconds] [rounds]
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-3}
rounds=${2:-4}
: "${DATABASE_URL:?DATABASE_URL must be set}"
PGOPTIONS="-c client_min_messages=warning" psql -q -X "$DATABASE_URL" -f groups.sql
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
payload='{"amount":1,"currency":"EUR","note":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'
tag=$$-$RANDOM
# group NAME FUNCTION N: a call of N single-event appends, one stream each.
group() {
	local name=$1 fn=$2 n=$3 streams="" expected="" appends="" index="" ids="" types="" data="" meta="" sep
	for i in $(seq 1 "$n"); do
		sep=$([ "$i" -gt 1 ] && echo , || true)
		streams+="$sep'g$tag-$name-$i'"; expected+="${sep}NULL"; appends+="$sep$i"; index+="${sep}1"
		ids+="${sep}gen_random_uuid()"; types+="$sep'bench.deposited'"; data+="$sep'$payload'"; meta+="${sep}NULL"
	done
	if [ "$fn" = batch ]; then
		echo "SELECT count(*) FROM annals.append_batch(ARRAY[$streams], ARRAY[$expected]::bigint[], ARRAY[$appends], ARRAY[$index], ARRAY[$ids], ARRAY[$types], ARRAY[$data], ARRAY[$meta]::text[], true);" >"$dir/$name.sql"
	else
		echo "SELECT status FROM appendcost_groups.lean(ARRAY[$streams], ARRAY[$expected]::bigint[], ARRAY[$ids], ARRAY[$types], ARRAY[$data], ARRAY[$meta]::text[], true);" >"$dir/$name.sql"
	fi
}
. ./cpu.sh # cpu SCRIPT: the backend's CPU per call, as in run.sh
for n in 1 4 16; do
	group "batch$n" batch "$n"
	group "lean$n" lean "$n"
done
for round in $(seq 1 "$rounds"); do
	echo "round $round"
	for n in 1 4 16; do
		# The order alternates from round to round.
		if [ $((round % 2)) = 1 ]; then pair="batch$n lean$n"; else pair="lean$n batch$n"; fi
		for s in $pair; do cpu "$s"; done
	done
	for s in batch4 lean4; do
		echo "$s, 4 clients: $(pgbench -n -M prepared -c 4 -j 2 -T "$secs" -f "$dir/$s.sql" "$DATABASE_URL" | awk '/^tps/ {print int($3)}') calls/s"
	done
done
