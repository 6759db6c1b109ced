package eventstore

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
)

// A lone append by a session user whose roles disagree (appendFnAsk) goes
// as BEGIN with the question, then the append with COMMIT. When the
// connection is lost right after the append and its COMMIT were sent, the
// server may commit it, and the append must say ErrOutcomeUnknown, never
// ErrNotWritten ("nothing was written"). With a pool in
// QueryExecModeSimpleProtocol, pgx (v5.12) reports the lost answer of such
// a batch as an error safe to retry.
func TestAppendAloneAskingLostAtCommitIsOutcomeUnknown(t *testing.T) {
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := context.Background()
			db := annalstest.NewDB(t, nil)
			cp := annalstest.NewCutPool(t, db, func(c *pgxpool.Config) {
				c.ConnConfig.DefaultQueryExecMode = mode
				c.MaxConns = 1 // the append runs on the connection armed below
			})
			s, err := New(cp.Pool, &Config{GroupCommit: GroupCommit{Disabled: true}})
			if err != nil {
				t.Fatal(err)
			}
			tx, err := cp.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			conn, err := cp.Of(ctx, tx)
			if err != nil {
				t.Fatal(err)
			}
			s.appendFns.Store(tx.Conn().PgConn().ParameterStatus(paramSessionUser), &appendChoice{fn: appendFnAsk, super: appendFnAsk})
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			// Cut after the second write that runs statements (a simple
			// Query, or Executes): the first runs BEGIN and the question,
			// the second the append and its COMMIT, which the server gets.
			runs := 0
			conn.CutAfter(func(b []byte) bool {
				if annalstest.HasExecute(b) || (len(b) > 0 && b[0] == 'Q') {
					runs++
				}
				return runs == 2
			})
			ev := EventData{Type: "t", Data: json.RawMessage(`{"a": 1}`)}
			_, err = s.Append(ctx, "ask-cut", NoStream, ev)
			if !conn.Cut() {
				t.Fatalf("the connection was not cut (append: %v)", err)
			}
			if errors.Is(err, ErrNotWritten) || !errors.Is(err, ErrOutcomeUnknown) {
				t.Fatalf("append whose connection was lost after its COMMIT was sent: %v; want ErrOutcomeUnknown, not ErrNotWritten", err)
			}
			// Whether the server got to commit it depends on when it
			// notices the client gone (the aggregate package's tests keep
			// the server's side open to make it commit): the outcome is
			// what the error must say it is, unknown.
			var n int
			if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{db.Schema}.Sanitize()+`.events WHERE stream_id = 'ask-cut'`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			t.Logf("%v; the stream holds %d event(s)", err, n)
		})
	}
}
