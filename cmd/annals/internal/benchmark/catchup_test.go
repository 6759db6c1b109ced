package benchmark

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/annals-dev/annals/annalstest"
)

func TestMain(m *testing.M) { annalstest.Main(m) }

// BenchmarkCatchup runs each catch-up contender on a log of
// ANNALS_BENCH_EVENTS events (default 200,000), for profiling:
//
//	go run ./cmd/annals dev -- go test ./internal/benchmark/ -run '^$' \
//	    -bench 'Catchup/projection$' -benchtime 3x -cpuprofile /tmp/cpu.out
//
// annals bench --only catchup is the measurement of record.
func BenchmarkCatchup(b *testing.B) {
	events := 200_000
	if s := os.Getenv("ANNALS_BENCH_EVENTS"); s != "" {
		var err error
		if events, err = strconv.Atoi(s); err != nil {
			b.Fatal(err)
		}
	}
	db := annalstest.NewDB(b, nil)
	c := (&CatchupConfig{Events: events}).withDefaults()
	ctx := context.Background()
	q, err := prepareCatchup(ctx, db.Pool, c)
	if err != nil {
		b.Fatal(err)
	}
	for _, ct := range catchupContenders(db.Pool, q, c, nil) {
		b.Run(ct.name, func(b *testing.B) {
			for b.Loop() {
				n, err := ct.fn(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if n != events {
					b.Fatalf("%d events, want %d", n, events)
				}
			}
			b.ReportMetric(float64(events*b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
