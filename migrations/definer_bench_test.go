package migrations_test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
)

// BenchmarkAppendSecurityDefiner compares one single-event append (one
// event per transaction, one connection) through append_events as migrated
// (SECURITY DEFINER with SET search_path) with the same body created as a
// plain SECURITY INVOKER function, alternating call by call on one database
// so that both see the same load; it reports the median latency of each and
// their ratio. "async" runs with synchronous_commit off, which takes the WAL
// flush out and leaves mostly the function's own cost. Run it with fsync on:
//
//	go run ./cmd/annals dev -- go test -run '^$' -bench AppendSecurityDefiner -benchtime 4000x ./migrations/
func BenchmarkAppendSecurityDefiner(b *testing.B) {
	ctx := context.Background()
	for _, commit := range []string{"sync", "async"} {
		b.Run(commit, func(b *testing.B) {
			db := annalstest.NewDB(b, &annalstest.Options{PoolConfig: func(c *pgxpool.Config) {
				c.MaxConns = 1
				if commit == "async" {
					c.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
				}
			}})
			var def string
			if err := db.Pool.QueryRow(ctx, `SELECT pg_get_functiondef('annals.append_events(text, bigint, jsonb)'::regprocedure)`).Scan(&def); err != nil {
				b.Fatal(err)
			}
			inv := regexp.MustCompile(`(?m)^ (SECURITY DEFINER|SET search_path.*)$\n`).ReplaceAllString(def, "")
			inv = regexp.MustCompile(`annals\.append_events\(`).ReplaceAllString(inv, "annals.append_events_invoker(")
			if inv == def || regexp.MustCompile(`SECURITY DEFINER|search_path`).MatchString(inv) {
				b.Fatalf("could not make an invoker copy of:\n%s", def)
			}
			if _, err := db.Pool.Exec(ctx, inv); err != nil {
				b.Fatal(err)
			}
			calls := map[string]string{
				"definer": `SELECT event_id FROM annals.append_events($1, NULL, '[{"type": "Bench", "data": {"n": 1}}]')`,
				"invoker": `SELECT event_id FROM annals.append_events_invoker($1, NULL, '[{"type": "Bench", "data": {"n": 1}}]')`,
			}
			took := map[string][]time.Duration{}
			i := 0
			for b.Loop() {
				for _, mode := range []string{"definer", "invoker"} {
					start := time.Now()
					if _, err := db.Pool.Exec(ctx, calls[mode], fmt.Sprintf("s-%d", i%64)); err != nil {
						b.Fatal(err)
					}
					took[mode] = append(took[mode], time.Since(start))
				}
				i++
			}
			med := map[string]time.Duration{}
			for mode, ds := range took {
				slices.Sort(ds)
				med[mode] = ds[len(ds)/2]
				b.ReportMetric(float64(med[mode].Microseconds()), mode+"-p50-µs")
				b.ReportMetric(float64(ds[len(ds)*9/10].Microseconds()), mode+"-p90-µs")
			}
			b.ReportMetric(float64(med["definer"])/float64(med["invoker"]), "definer/invoker")
		})
	}
}
