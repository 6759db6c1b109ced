package eventstore

import (
	"context"
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
