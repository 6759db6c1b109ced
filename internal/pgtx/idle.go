package pgtx

import (
	"math"
	"strconv"
	"time"
)

// IdleSetup is the statement that limits how long the transaction it runs
// in may stay idle between two statements to d
// (idle_in_transaction_session_timeout, local to the transaction), unless
// the session has a shorter limit of its own (a role's or a connection's
// setting, which it keeps). "" when d is 0 or less, or longer than the
// server takes (INT_MAX milliseconds). The value is a number formatted
// here, never input.
//
// The server ends a session that idles longer, which rolls its
// transaction back and frees its row locks: what annals sets on the
// transactions of a leader, so that a process frozen in the middle of one
// (SIGSTOP, a paused container) does not hold the rows its successor
// needs for as long as it stays frozen.
func IdleSetup(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	d = (d + time.Millisecond - 1).Truncate(time.Millisecond)
	if d/time.Millisecond > math.MaxInt32 {
		return ""
	}
	ms := strconv.FormatInt(d.Milliseconds(), 10)
	return `SELECT pg_catalog.set_config('idle_in_transaction_session_timeout', ` +
		`(CASE WHEN s.ms > 0 AND s.ms < ` + ms + ` THEN s.ms ELSE ` + ms + ` END)::text, true) ` +
		`FROM (SELECT (extract(epoch FROM pg_catalog.current_setting('idle_in_transaction_session_timeout')::interval) * 1000)::bigint AS ms) s`
}

// BeginIdle is the BEGIN of a transaction whose idle time is limited to d
// (IdleSetup), in one simple-protocol string, so in BEGIN's round trip:
// pgx sends a statement without arguments (pgx.TxOptions.BeginQuery among
// them) with the simple protocol. "" (pgx's plain BEGIN) when IdleSetup is.
func BeginIdle(d time.Duration) string {
	if s := IdleSetup(d); s != "" {
		return "BEGIN; " + s
	}
	return ""
}
