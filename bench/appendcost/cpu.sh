# Shared by run.sh and groups.sh (sourced): cpu, with $secs (seconds per
# run), $dir (holding SCRIPT.sql) and DATABASE_URL set by the caller.

# cpu SCRIPT: pgbench with one client; prints the backend's CPU time per
# call: utime + stime of its backend over a window of the run, divided by
# the calls pgbench reports per second times the window.
cpu() {
	pgbench -n -M prepared -c 1 -T "$secs" -f "$dir/$1.sql" "$DATABASE_URL" >"$dir/out" 2>&1 &
	local bench=$! pid="" t0 t1 w0 w1
	# pgbench may open and close a connection before its clients': look the
	# backend up again after a pause, until the one found is still there.
	for _ in $(seq 1 50); do
		sleep 0.3
		pid=$(psql -X -At "$DATABASE_URL" -c "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgbench' LIMIT 1")
		[ -n "$pid" ] && [ -e "/proc/$pid/stat" ] && break
	done
	w0=$(date +%s.%N)
	t0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
	sleep "$((secs - 1))"
	t1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
	w1=$(date +%s.%N)
	wait "$bench"
	awk -v t="$((t1 - t0))" -v w="$w0" -v w1="$w1" -v hz="$(getconf CLK_TCK)" -v name="$1" \
		-v tps="$(awk '/^tps/ {print $3}' "$dir/out")" \
		'BEGIN { printf "%-12s %6.0f µs backend CPU per call, %6.0f calls/s\n", name, t / hz / (tps * (w1 - w)) * 1e6, tps }'
}
