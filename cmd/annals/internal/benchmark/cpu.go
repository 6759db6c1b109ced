package benchmark

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/internal/procstat"
)

// cpuMeter measures the CPU time of the server (when it runs on this
// machine: annals dev, the test clusters) and of this process over one
// measurement: a rate moves with whatever else the machine runs, the CPU
// time each event costs stays put (docs/benchmarks.md, "CPU per event").
type cpuMeter struct {
	server *procstat.Server // nil: the server's is not measured
}

// newCPUMeter finds what can be measured; why says why the server's CPU
// time cannot be.
func newCPUMeter(ctx context.Context, pool *pgxpool.Pool) (m cpuMeter, why string) {
	m.server, why = procstat.FindServer(ctx, pool)
	return m, why
}

// cpuSample is the CPU time used so far; server is zero when not measured.
type cpuSample struct {
	server, client time.Duration
}

func (m cpuMeter) sample() (cpuSample, error) {
	var s cpuSample
	if m.server != nil {
		var err error
		if s.server, err = m.server.Total(); err != nil {
			return s, err
		}
	}
	s.client = procstat.Self()
	return s, nil
}

// perEvent is the CPU time per event between two samples, in µs; server is
// nil when the server's is not measured.
func (m cpuMeter) perEvent(before, after cpuSample, events int64) (server *float64, client float64) {
	if events <= 0 {
		return nil, 0
	}
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(events) }
	if m.server != nil {
		v := us(after.server - before.server)
		server = &v
	}
	return server, us(after.client - before.client)
}
