#!/usr/bin/env bash
# Makes sure PgBouncer is installed, for the tests that append and read
# through a pooler in transaction mode (internal/pgcluster.StartPgBouncer,
# eventstore/TestThroughPgBouncer). Installs Debian's pgbouncer package when
# it is missing and we may (root with apt-get). ANNALS_PGBOUNCER, when set,
# names the binary to use instead.
set -euo pipefail

have_pgbouncer() {
	if [ -n "${ANNALS_PGBOUNCER:-}" ] && [ -x "${ANNALS_PGBOUNCER}" ]; then
		return 0
	fi
	command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]
}

if have_pgbouncer; then
	exit 0
fi

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "ensure-pgbouncer: installing PgBouncer with apt-get ..." >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq </dev/null
	# The package's own service is not wanted: the tests start their own.
	apt-get install -y -qq --no-install-recommends pgbouncer </dev/null >/dev/null
	if command -v systemctl >/dev/null 2>&1; then systemctl disable --now pgbouncer >/dev/null 2>&1 || true; fi
	have_pgbouncer && exit 0
	echo "ensure-pgbouncer: apt-get installed pgbouncer but it is still not found" >&2
	exit 1
fi

cat >&2 <<'MSG'
ensure-pgbouncer: no PgBouncer found (the tests through a transaction-mode pooler need one).
Install it (Debian/Ubuntu: sudo apt-get install pgbouncer; macOS: brew install pgbouncer),
or point ANNALS_PGBOUNCER at a pgbouncer binary.
MSG
exit 1
