package eventstore

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/annals-dev/annals/annalstest"
)

// BenchmarkAppendQuery measures the client's choice of the append function
// for a transaction once the Store knows the answer for the session: what
// AppendTx, Transact and a lone append pay for it at every call, without
// a round trip.
func BenchmarkAppendQuery(b *testing.B) {
	ctx := context.Background()
	db := annalstest.NewDB(b, nil)
	s, err := New(db.Pool, nil)
	if err != nil {
		b.Fatal(err)
	}
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	if _, err := s.appendQuery(ctx, conn.Conn()); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.appendQuery(ctx, conn.Conn()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAppendAloneAsking measures a lone append (no group commit) of
// one event by a session user whose roles disagree (appendFnAsk): the
// question about the role in effect and the append, in one transaction
// (BEGIN with the question, then the append with COMMIT, pipelined).
//
//	annals dev -- sh -c 'ANNALS_TEST_DATABASE_URL=$DATABASE_URL go test -run XXX -bench AppendAloneAsking -count 5 ./eventstore/'
func BenchmarkAppendAloneAsking(b *testing.B) {
	ctx := context.Background()
	db := annalstest.NewDB(b, nil)
	s, err := New(db.Pool, &Config{GroupCommit: GroupCommit{Disabled: true}})
	if err != nil {
		b.Fatal(err)
	}
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	s.appendFns.Store(conn.Conn().PgConn().ParameterStatus(paramSessionUser), &appendChoice{fn: appendFnAsk, super: appendFnAsk})
	conn.Release()
	ev := EventData{Type: "t", Data: json.RawMessage(`{"a": 1}`)}
	n := 0
	b.ReportAllocs()
	for b.Loop() {
		n++
		if _, err := s.Append(ctx, fmt.Sprintf("ask-%d", n), NoStream, ev); err != nil {
			b.Fatal(err)
		}
	}
}
