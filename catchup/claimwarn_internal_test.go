package catchup

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// A partition whose claims keep timing out on a held checkpoint row is
// without a leader: after claimBlockedWarn of it a warning says so (once
// per claimBlockedWarn).
func TestClaimTimeoutsWarnWhenTheyLast(t *testing.T) {
	var buf bytes.Buffer
	e := &Engine{cfg: Config{Logger: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}}
	s := &sessions{e: e, blocked: map[string]*claimBlock{}}
	w := &waiter{key: "k", sub: &Subscription{Name: "s", Partition: 3}}
	err := &pgconn.PgError{Code: "55P03", Message: "canceling statement due to lock timeout"}
	warns := func() int { return strings.Count(buf.String(), "level=WARN") }

	s.logClaimTimeout(context.Background(), "k", w, err)
	if n := warns(); n != 0 {
		t.Fatalf("%d warnings after the first timeout; want 0:\n%s", n, buf.String())
	}
	s.blocked["k"].since = time.Now().Add(-claimBlockedWarn) // blocked that long already
	s.logClaimTimeout(context.Background(), "k", w, err)
	s.logClaimTimeout(context.Background(), "k", w, err)
	if n := warns(); n != 1 || !strings.Contains(buf.String(), "partition=3") {
		t.Fatalf("%d warnings after the claims kept timing out; want 1 naming the partition:\n%s", n, buf.String())
	}
	s.blocked["k"].warned = time.Now().Add(-claimBlockedWarn)
	s.logClaimTimeout(context.Background(), "k", w, err)
	if n := warns(); n != 2 {
		t.Fatalf("%d warnings one interval later; want 2:\n%s", n, buf.String())
	}
}
