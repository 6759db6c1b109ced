#!/usr/bin/env bash
# Makes sure PostgreSQL server binaries (initdb, postgres) are installed, for
# the throwaway clusters of `make test` and `make demo`. Installs Debian's
# postgresql package when they are missing and we may (root with apt-get).
set -euo pipefail

have_binaries() {
	if command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1; then
		return 0
	fi
	compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}

if have_binaries; then
	exit 0
fi

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "ensure-postgres: installing PostgreSQL server binaries with apt-get ..." >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq </dev/null
	apt-get install -y -qq postgresql </dev/null >/dev/null
	have_binaries && exit 0
	echo "ensure-postgres: apt-get installed postgresql but initdb is still not found" >&2
	exit 1
fi

cat >&2 <<'MSG'
ensure-postgres: PostgreSQL server binaries (initdb, postgres) are not installed.
Install them (Debian/Ubuntu: sudo apt-get install postgresql; macOS: brew install postgresql),
or point the tests at a server you run: ANNALS_TEST_DATABASE_URL=postgres://user@host/db make test
MSG
exit 1
