package console

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/annals-dev/annals/internal/leadership"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/standby"
	"github.com/annals-dev/annals/internal/telemetry"
)

// MetricsConfig configures NewMetrics. A nil *MetricsConfig means defaults.
type MetricsConfig struct {
	// Schema is the PostgreSQL schema holding the annals tables. Defaults
	// to "annals".
	Schema string
	// StaleAfter is the heartbeat age past which a runner instance is
	// stale (and leads nothing). Defaults to 30s.
	StaleAfter time.Duration
	// ScrapeTimeout bounds the database reads of one scrape. Defaults to 5s.
	ScrapeTimeout time.Duration
	// Registry receives the collectors. Defaults to a new registry with the
	// Go runtime and process collectors.
	Registry *prometheus.Registry
}

// Metrics serves /metrics in the Prometheus text format: the annals
// OpenTelemetry instruments of whatever is given MeterProvider() (appends,
// handler and batch durations, retries, dead letters written, lag and
// leadership of the partitions this process leads), exported through the
// OpenTelemetry Prometheus exporter; and series read from the database at
// each scrape, which are right whichever process runs the subscribers (the
// annals_* series without an OpenTelemetry origin, listed in
// docs/operations.md).
type Metrics struct {
	reg     *prometheus.Registry
	mp      *sdkmetric.MeterProvider
	handler http.Handler
}

// NewMetrics returns the metrics of the database behind pool.
func NewMetrics(pool *pgxpool.Pool, cfg *MetricsConfig) (*Metrics, error) {
	var c MetricsConfig
	if cfg != nil {
		c = *cfg
	}
	var err error
	if c.Schema, err = schemaname.Resolve(c.Schema); err != nil {
		return nil, err
	}
	if c.StaleAfter <= 0 {
		c.StaleAfter = 30 * time.Second
	}
	if c.ScrapeTimeout <= 0 {
		c.ScrapeTimeout = 5 * time.Second
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
		c.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	rd, err := newReader(pool, c.Schema, c.StaleAfter)
	if err != nil {
		return nil, err
	}
	exp, err := otelprom.New(otelprom.WithRegisterer(c.Registry))
	if err != nil {
		return nil, errors.Wrap(err, "console: the OpenTelemetry Prometheus exporter")
	}
	if err := c.Registry.Register(&dbCollector{rd: rd, timeout: c.ScrapeTimeout}); err != nil {
		return nil, errors.Wrap(err, "console: register the database collector")
	}
	return &Metrics{
		reg:     c.Registry,
		mp:      sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp)),
		handler: promhttp.HandlerFor(c.Registry, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}),
	}, nil
}

// MeterProvider is the OpenTelemetry meter provider whose instruments
// /metrics exports. Give it to eventstore.Config.MeterProvider and
// projection.Config.MeterProvider (or install it with otel.SetMeterProvider).
func (m *Metrics) MeterProvider() metric.MeterProvider { return m.mp }

// Registry is the Prometheus registry /metrics serves.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// ServeHTTP serves the metrics in the Prometheus text format.
func (m *Metrics) ServeHTTP(w http.ResponseWriter, r *http.Request) { m.handler.ServeHTTP(w, r) }

// Shutdown stops the meter provider.
func (m *Metrics) Shutdown(ctx context.Context) error { return m.mp.Shutdown(ctx) }

var (
	subLabels      = []string{"subscriber", "partition"}
	descUp         = prometheus.NewDesc("annals_database_up", "1 when the last scrape read the database, else 0.", nil, nil)
	descScrape     = prometheus.NewDesc("annals_database_scrape_duration_seconds", "How long the scrape's database reads took.", nil, nil)
	descHead       = prometheus.NewDesc("annals_head_position", "Position of the last event in the log (0: empty).", nil, nil)
	descPosition   = prometheus.NewDesc("annals_subscriber_checkpoint_position", "Checkpoint of a subscriber partition: the last position processed.", subLabels, nil)
	descLag        = prometheus.NewDesc("annals_subscriber_lag_events", "Events after the checkpoint (counted exactly up to 10000, beyond that head - position).", subLabels, nil)
	descLagTime    = prometheus.NewDesc("annals_subscriber_lag_seconds", "Age of the oldest event after the checkpoint (0: caught up).", subLabels, nil)
	descEpoch      = prometheus.NewDesc("annals_subscriber_epoch", "Fencing epoch of a subscriber partition; it grows by one at each change of leader (and each operator's checkpoint set).", subLabels, nil)
	descLed        = prometheus.NewDesc("annals_subscriber_led", "1 when a live runner instance leads the partition (holding its advisory lock), else 0 (also while a session no live instance lists holds the lock; absent for a retired blue/green generation).", subLabels, nil)
	descStopped    = prometheus.NewDesc("annals_subscriber_stopped", "1 when the partition is halted by the Stop policy, else 0 (absent for a retired blue/green generation).", subLabels, nil)
	descDLQ        = prometheus.NewDesc("annals_dead_letters", "Dead letters by subscriber and status (open, retry, resolved, skipped).", []string{"subscriber", "status"}, nil)
	descGeneration = prometheus.NewDesc("annals_read_model_generation", "1 for each generation of a blue/green read model, by the subscriber that runs it and its state (building, live, retired): a building generation catches up from the log's start, so `unless on(subscriber) annals_read_model_generation{state=\"building\"}` leaves it out of lag alerts.", []string{"read_model", "generation", "subscriber", "state"}, nil)
	descKind       = prometheus.NewDesc("annals_subscriber_kind", "1 for each subscriber whose kind the runner recorded (projection, observer, saga, processor, relay, tail; absent when unknown), as `annals status` reads it.", []string{"subscriber", "kind"}, nil)
	descStandbys   = prometheus.NewDesc("annals_standbys", "Physical standbys streaming from the server (pg_stat_replication; logical walsenders left out).", nil, nil)
	descReplay     = prometheus.NewDesc("annals_standby_replay_lag_bytes", "WAL written on the server that the standby has not replayed yet (absent while hidden from a role without pg_read_all_stats).", []string{"standby", "pid"}, nil)
	descReplayTime = prometheus.NewDesc("annals_standby_replay_lag_seconds", "PostgreSQL's replay_lag of the standby (0 when caught up and idle; absent when unknown or hidden).", []string{"standby", "pid"}, nil)
	descInstances  = prometheus.NewDesc("annals_instances", "Registered runner instances by state (live, lost, stale).", []string{"state"}, nil)
	descTimers     = prometheus.NewDesc("annals_timers", "Scheduler timers by state (pending, failed).", []string{"state"}, nil)
)

// dbCollector reads the series of the database at each scrape, in one
// read-only snapshot.
type dbCollector struct {
	rd      *reader
	timeout time.Duration
}

func (d *dbCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, x := range []*prometheus.Desc{descUp, descScrape, descHead, descPosition, descLag, descLagTime, descEpoch,
		descLed, descStopped, descGeneration, descKind, descDLQ, descInstances, descTimers, descStandbys, descReplay, descReplayTime} {
		ch <- x
	}
}

func (d *dbCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), d.timeout)
	defer cancel()
	start := time.Now()
	var out []prometheus.Metric
	g := func(desc *prometheus.Desc, v float64, labels ...string) {
		out = append(out, prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...))
	}
	err := d.rd.readOnlyTx(ctx, func(tx pgx.Tx) error {
		head, _, err := d.rd.head(ctx, tx)
		if err != nil {
			return err
		}
		g(descHead, float64(head))
		parts, ins, err := d.rd.leadership(ctx, tx, head, nil, lagCountLimit)
		if err != nil {
			return err
		}
		generations, kinds := map[string]bool{}, map[string]bool{}
		for _, p := range parts {
			l := []string{p.Subscriber, strconv.Itoa(p.Partition)}
			if p.Kind != "" && !kinds[p.Subscriber] {
				kinds[p.Subscriber] = true
				g(descKind, 1, p.Subscriber, p.Kind)
			}
			if gen := p.Generation; gen != nil && !generations[p.Subscriber] {
				generations[p.Subscriber] = true
				g(descGeneration, 1, gen.ReadModel, strconv.Itoa(gen.Generation), p.Subscriber, gen.State)
			}
			g(descPosition, float64(p.Position), l...)
			g(descEpoch, float64(p.Epoch), l...)
			if p.Retired() {
				// Nothing runs a retired blue/green generation: that nobody
				// leads it, the cut-over's stop and its lag are expected, and
				// series saying so would fire the alerts on them.
				continue
			}
			g(descLag, float64(p.LagEvents), l...)
			g(descLagTime, p.LagSeconds, l...)
			g(descLed, b2f(p.Leader != "" && !p.LeaderStale && !p.NoLiveInstance), l...)
			g(descStopped, b2f(p.Stopped != ""), l...)
		}
		counts, err := d.rd.deadLetterCounts(ctx, tx)
		if err != nil {
			return err
		}
		for sub, m := range counts {
			for _, st := range []string{"open", "retry", "resolved", "skipped"} {
				g(descDLQ, float64(m[st]), sub, st)
			}
		}
		states := map[string]int{}
		for _, in := range ins {
			states[in.State]++
		}
		for _, st := range []string{leadership.Live, leadership.Lost, leadership.Stale} {
			g(descInstances, float64(states[st]), st)
		}
		var pending, failed int64
		if err := tx.QueryRow(ctx, d.rd.q["TimerCounts"]).Scan(&pending, &failed); err != nil {
			return errors.Wrap(err, "count the timers")
		}
		g(descTimers, float64(pending), "pending")
		g(descTimers, float64(failed), "failed")
		standbys, err := standby.List(ctx, tx)
		if err != nil {
			return err
		}
		g(descStandbys, float64(len(standbys)))
		for _, sb := range standbys {
			l := []string{"", strconv.Itoa(int(sb.PID))}
			if sb.ApplicationName != nil {
				l[0] = *sb.ApplicationName
			}
			if sb.ReplayLagBytes != nil {
				g(descReplay, float64(*sb.ReplayLagBytes), l...)
			}
			if sec := sb.LagSeconds(); sec != nil {
				g(descReplayTime, *sec, l...)
			}
		}
		return nil
	})
	if err != nil {
		d.rd.log.Warn("console: metrics: read the database", telemetry.Err(err))
		ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, 0)
		return
	}
	for _, m := range out {
		ch <- m
	}
	ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(descScrape, prometheus.GaugeValue, time.Since(start).Seconds())
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
