package console

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/projection"
)

// Liveness answers 200 "ok" while the process serves HTTP: /healthz.
func Liveness() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write([]byte("ok\n"))
	})
}

// HealthConfig configures Readiness and RunnerHealth. A nil *HealthConfig
// means defaults.
type HealthConfig struct {
	// Schema is the PostgreSQL schema holding the annals tables. Defaults
	// to "annals" (RunnerHealth: the runner's schema).
	Schema string
	// Subscribers are the subscribers that must be healthy, with their
	// partition counts (name → partitions). Defaults to none for Readiness
	// (only the database is checked); RunnerHealth fills it from the
	// runner's registered subscribers.
	Subscribers map[string]int
	// MaxLagEvents, when positive, makes a partition further behind than
	// this many events unhealthy. Defaults to 0 (no limit).
	MaxLagEvents int64
	// MaxLagTime, when positive, makes a partition whose oldest unprocessed
	// event is older than this unhealthy. Defaults to 0 (no limit).
	MaxLagTime time.Duration
	// StaleAfter is the heartbeat age past which an instance is stale: no
	// live leader, even while its session still holds a lock.
	// Defaults to 30s.
	StaleAfter time.Duration
	// Timeout bounds the database reads of one check. Defaults to 5s.
	Timeout time.Duration
}

// HealthReport is the JSON body of a health check.
type HealthReport struct {
	// OK is true when the database answers and every partition checked is
	// healthy; the status code is then 200, else 503.
	OK bool `json:"ok"`
	// Error is why the database could not be read ("" when it could).
	Error string `json:"error,omitempty"`
	// Head is the position of the last event in the log.
	Head int64 `json:"head"`
	// Partitions has one element per partition checked.
	Partitions []PartitionHealth `json:"partitions"`
}

// PartitionHealth is one subscriber partition in a HealthReport.
type PartitionHealth struct {
	// Subscriber is the subscriber checked: for a blue/green projection,
	// its live generation's ("name#gN"), which keeps the checkpoint.
	Subscriber string `json:"subscriber"`
	// ReadModel is, for a blue/green projection checked through its live
	// generation, the name it was asked by (the registered name).
	ReadModel  string  `json:"read_model,omitempty"`
	Partition  int     `json:"partition"`
	OK         bool    `json:"ok"`
	Leader     string  `json:"leader"`
	LagEvents  int64   `json:"lag_events"`
	LagSeconds float64 `json:"lag_seconds"`
	// Problem says what is wrong ("" when OK): no checkpoint yet, no live
	// leader (none, a stale one, or a lock held by a session no live
	// instance lists), stopped, or too far behind.
	Problem string `json:"problem,omitempty"`
	// Retired reports a partition of a retired blue/green generation
	// (kept for a rollback, run by nobody): it is OK whatever its leader,
	// stop and lag.
	Retired bool `json:"retired,omitempty"`
}

// Readiness is /readyz: 200 when the database answers and the schema is
// migrated, and every subscriber of cfg.Subscribers is healthy (see
// RunnerHealth), else 503; the body is a HealthReport. A partition of a
// retired blue/green generation (<read model>#g<N>) is healthy: nothing
// runs it.
func Readiness(pool *pgxpool.Pool, cfg *HealthConfig) http.Handler {
	var c HealthConfig
	if cfg != nil {
		c = *cfg
	}
	schema, err := schemaname.Resolve(c.Schema)
	if c.StaleAfter <= 0 {
		c.StaleAfter = 30 * time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Second
	}
	var rd *reader
	if err == nil {
		rd, err = newReader(pool, schema, c.StaleAfter)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rep := HealthReport{Partitions: []PartitionHealth{}}
		if err != nil {
			rep.Error = err.Error()
		} else {
			ctx, cancel := context.WithTimeout(r.Context(), c.Timeout)
			rep = check(ctx, rd, &c)
			cancel()
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if !rep.OK {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(rep)
	})
}

// RunnerHealth is the one call a service embedding a projection.Runner
// makes for its readiness endpoint: it reports, from the database, whether
// every subscriber partition registered with runner is led by a live
// instance somewhere (this process or another), is not stopped, and is no
// further behind than cfg allows. A blue/green projection is checked
// through its live generation (the subscriber "name#gN" that runs it).
//
//	mux.Handle("/readyz", console.RunnerHealth(runner, pool, &console.HealthConfig{MaxLagTime: time.Minute}))
func RunnerHealth(runner *projection.Runner, pool *pgxpool.Pool, cfg *HealthConfig) http.Handler {
	var c HealthConfig
	if cfg != nil {
		c = *cfg
	}
	c.Schema = runner.Schema()
	c.Subscribers = map[string]int{}
	for _, s := range runner.Registered() {
		c.Subscribers[s.Name] = max(1, s.Partitions)
	}
	return Readiness(pool, &c)
}

func check(ctx context.Context, rd *reader, c *HealthConfig) HealthReport {
	rep := HealthReport{Partitions: []PartitionHealth{}}
	var parts []Partition
	err := rd.readOnlyTx(ctx, func(tx pgx.Tx) error {
		var err error
		if rep.Head, _, err = rd.head(ctx, tx); err != nil {
			return err
		}
		if len(c.Subscribers) > 0 {
			parts, err = rd.partitions(ctx, tx, rep.Head, nil)
		}
		return err
	})
	if err != nil {
		rep.Error = err.Error()
		return rep
	}
	byKey := map[string]Partition{}
	present := map[string]bool{}
	// A blue/green projection is run as its live generation's subscriber
	// ("name#gN"): its registered name has no checkpoint of its own.
	liveGen := map[string]string{}
	for _, p := range parts {
		byKey[p.Subscriber+"\x00"+strconv.Itoa(p.Partition)] = p
		present[p.Subscriber] = true
		if g := p.Generation; g != nil && g.State == "live" {
			liveGen[g.ReadModel] = p.Subscriber
		}
	}
	rep.OK = true
	for _, name := range sortedKeys(c.Subscribers) {
		sub, readModel := name, ""
		if g, ok := liveGen[name]; ok && !present[name] {
			sub, readModel = g, name
		}
		for part := range c.Subscribers[name] {
			h := PartitionHealth{Subscriber: sub, ReadModel: readModel, Partition: part, OK: true}
			p, found := byKey[sub+"\x00"+strconv.Itoa(part)]
			h.Leader, h.LagEvents, h.LagSeconds, h.Retired = p.Leader, p.LagEvents, p.LagSeconds, p.Retired()
			switch {
			case h.Retired:
				// Nothing runs it: no leader, its stop and its lag are expected.
			case !found:
				h.Problem = "no checkpoint yet: no instance has led it"
			case p.Stopped != "":
				h.Problem = "stopped: " + p.Stopped
			case p.NoLiveInstance:
				h.Problem = "no live leader: the lock is held by " + p.heldBy() + ", which no live instance lists"
			case p.Leader == "":
				h.Problem = "no live leader"
			case p.LeaderStale:
				h.Problem = "no live leader: " + p.Leader + " holds the lock, but its heartbeat is stale"
			case c.MaxLagEvents > 0 && p.LagEvents > c.MaxLagEvents:
				h.Problem = "behind by " + strconv.FormatInt(p.LagEvents, 10) + " events"
			case c.MaxLagTime > 0 && p.LagSeconds > c.MaxLagTime.Seconds():
				h.Problem = "behind by " + time.Duration(p.LagSeconds*float64(time.Second)).Round(time.Second).String()
			}
			if h.Problem != "" {
				h.OK, rep.OK = false, false
			}
			rep.Partitions = append(rep.Partitions, h)
		}
	}
	return rep
}
