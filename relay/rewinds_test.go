package relay

import (
	"encoding/json"
	"testing"
	"time"
)

// TestRewindsSince: a consumer placed in a stream is judged by the rewind
// that agrees least far among those found under that stream or one made
// after it; with, recording, keeps every stream's (the lowest for one);
// the stamp leaves out what no place needs, and past maxStamped folds the
// oldest two into one that stops no fewer consumers.
func TestRewindsSince(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 123456789, time.UTC)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Hour) }
	var rs Rewinds
	rs, got := rs.with(Rewound{Stream: "S", Created: at(2), At: 200})
	if got != 200 {
		t.Fatalf("recorded %d, want 200", got)
	}
	rs, _ = rs.with(Rewound{Stream: "S", Created: at(0), At: 100}) // an older stream's, recorded late
	if rs, got = rs.with(Rewound{Stream: "S", Created: at(2), At: 250}); got != 200 {
		t.Fatalf("recorded %d for the same stream again, want the lowest (200)", got)
	}
	rs, _ = rs.with(Rewound{Stream: "S", Created: at(4), At: 300})
	if len(rs) != 3 || rs[0].At != 100 || rs[1].At != 200 || rs[2].At != 300 {
		t.Fatalf("recorded %+v, want 100, 200, 300 in stream order", rs)
	}
	for _, c := range []struct {
		place time.Time
		want  int64 // -1: none
	}{
		{at(-1), 100}, {at(0), 100}, {at(0).Truncate(time.Microsecond), 100}, {at(1), 200}, {at(2), 200},
		{at(3), 300}, {at(4), 300}, {at(5), -1},
	} {
		rw, ok := rs.Since(c.place)
		if !ok && c.want != -1 || ok && rw.At != c.want {
			t.Errorf("Since(%v) = %+v, %v; want %d", c.place, rw, ok, c.want)
		}
	}
	// The rewinds the stamp holds answer alike.
	back, ok, err := RewindsOf(rs.Stamp())
	if err != nil || !ok || len(back) != 3 {
		t.Fatalf("RewindsOf(Stamp()) = %+v, %v, %v", back, ok, err)
	}
	// A rewind that agrees further than a later one is left out of the
	// stamp: the later one stops every consumer it would.
	rs2, _ := rs.with(Rewound{Stream: "S", Created: at(6), At: 150})
	if st := rs2.stamped(); len(st) != 2 || st[0].At != 100 || st[1].At != 150 || !st[1].Created.Equal(at(6)) {
		t.Fatalf("stamped %+v, want 100 (of the first stream), 150 (of the last)", st)
	}
	if _, ok := Rewinds(nil).Since(at(0)); ok || Rewinds(nil).Stamp() != nil {
		t.Fatal("no rewinds: Since found one, or a stamp")
	}

	// Past maxStamped: the oldest folded, never a place left unstopped.
	var many Rewinds
	for i := range 3 * maxStamped {
		many, _ = many.with(Rewound{Stream: "S", Created: at(i), At: int64(10 * (i + 1))})
	}
	md := many.Stamp()
	st, _, err := RewindsOf(md)
	if err != nil || len(st) != maxStamped {
		t.Fatalf("a stamp of %d rewinds holds %d (%v), want %d", len(many), len(st), err, maxStamped)
	}
	if n := len(md[MetadataRewinds]); n > 4096 {
		t.Errorf("a stamp of %d rewinds is %d bytes", maxStamped, n)
	}
	for i := -1; i <= len(many); i++ {
		want, wok := many.Since(at(i))
		got, gok := st.Since(at(i))
		if wok != gok || gok && got.At > want.At {
			t.Errorf("placed in the stream made at hour %d: the stamp says %+v (%v), the record %+v (%v)", i, got, gok, want, wok)
		}
		if i >= len(many)-maxStamped+1 && got.At != want.At {
			t.Errorf("placed in the stream made at hour %d, after the folded ones: the stamp says %d, the record %d", i, got.At, want.At)
		}
	}

	// Stamps that do not parse.
	for _, v := range []string{`6`, `[{"stream":"S","at":-1,"created":"2026-11-30T12:00:00Z"}]`, `[{"stream":"S","at":1}]`} {
		if _, _, err := RewindsOf(map[string]string{MetadataRewinds: v}); err == nil {
			t.Errorf("RewindsOf(%s): no error", v)
		}
	}
	if b, _ := json.Marshal(rs[:1]); string(b) != `[{"stream":"S","created":"2026-11-30T12:00:00.123456789Z","at":100}]` {
		t.Errorf("JSON %s", b)
	}
}
