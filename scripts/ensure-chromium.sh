#!/usr/bin/env bash
# Makes sure a Chromium browser is installed, for the console's browser test
# (console/browser_test.go drives it headless with chromedp). Installs
# Debian's chromium package when it is missing and we may (root with
# apt-get). ANNALS_CHROMIUM, when set, names the browser to use instead.
set -euo pipefail

have_browser() {
	if [ -n "${ANNALS_CHROMIUM:-}" ] && [ -x "${ANNALS_CHROMIUM}" ]; then
		return 0
	fi
	local b
	for b in chromium chromium-browser google-chrome google-chrome-stable; do
		command -v "$b" >/dev/null 2>&1 && return 0
	done
	return 1
}

if have_browser; then
	exit 0
fi

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "ensure-chromium: installing Chromium with apt-get ..." >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq </dev/null
	apt-get install -y -qq chromium </dev/null >/dev/null
	have_browser && exit 0
	echo "ensure-chromium: apt-get installed chromium but it is still not found" >&2
	exit 1
fi

cat >&2 <<'MSG'
ensure-chromium: no Chromium browser found (the console's browser test needs one).
Install it (Debian/Ubuntu: sudo apt-get install chromium; macOS: brew install --cask chromium),
or point ANNALS_CHROMIUM at a Chromium or Chrome binary.
MSG
exit 1
