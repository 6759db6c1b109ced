package natsconsumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/relay/natsconsumer"
)

// nothing is a projection that writes nothing: only its checkpoint moves.
type nothing struct{}

func (nothing) Name() string { return "nothing" }

func (nothing) Handle(context.Context, pgx.Tx, eventstore.Event) error { return nil }

// TestConsumersStartingAtOnceOnAFreshSchema: replicas (or the projections
// of one service) start together on a database without the checkpoint
// table: several RunProjection, each of its own durable and pool, released
// at the same moment, in a schema nobody made yet (half of them with
// sessions defaulting to REPEATABLE READ). Every one starts and
// handles the event; the table is made once. Before, they raced on CREATE
// SCHEMA / CREATE TABLE IF NOT EXISTS, which PostgreSQL does not make safe
// against a concurrent creator: the losers stopped at once with a unique
// violation on the catalogs (23505) or "already exists" (42P07). Five
// fresh schemas, so that the race is run more than once.
func TestConsumersStartingAtOnceOnAFreshSchema(t *testing.T) {
	t.Parallel()
	const consumers, rounds = 6, 5
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	e.appendAndRelay(t, ctx, 1)
	// A pool each, connected before the start, as replicas have; every
	// other one's sessions default to REPEATABLE READ.
	pools := make([]*pgxpool.Pool, consumers)
	for i := range pools {
		cfg, err := pgxpool.ParseConfig(e.dst.URL)
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		if err := pool.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		pools[i] = pool
	}
	for round := range rounds {
		// A subtest per round: its database and pools go at its end.
		t.Run(fmt.Sprintf("round %d", round), func(t *testing.T) {
			schema := fmt.Sprintf("start_race_%d", round)
			cs := make([]*natsconsumer.Consumer, consumers)
			durables := make([]string, consumers)
			for i := range cs {
				durables[i] = fmt.Sprintf("race-%d-%d", round, i)
				c, err := natsconsumer.New(ctx, e.nc, &natsconsumer.Config{Durable: durables[i], Schema: schema,
					RetryBackoff: 20 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				cs[i] = c
			}
			rctx, stop := context.WithCancel(ctx)
			release := make(chan struct{})
			done := make(chan error, consumers)
			for i, c := range cs {
				go func() {
					<-release
					done <- c.RunProjection(rctx, pools[i], nothing{})
				}()
			}
			close(release)
			var early error
			returned := 0
			annalstest.WaitFor(t, 30*time.Second, func() bool {
				select {
				case early = <-done:
					returned++
					if early == nil {
						early = fmt.Errorf("RunProjection returned nil before its context ended")
					}
					return true
				default:
				}
				var n int
				_ = e.dst.Pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "relay_checkpoints"}.Sanitize()+
					` WHERE consumer = ANY($1) AND stream_seq = 1`, durables).Scan(&n)
				return n == consumers
			})
			stop()
			for range consumers - returned {
				if err := <-done; err != nil && early == nil {
					early = err
				}
			}
			if early != nil {
				t.Fatalf("round %d: a consumer starting with %d others on a fresh schema stopped: %v", round, consumers-1, early)
			}
			var tables int
			if err := e.dst.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_class c
			JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relname = 'relay_checkpoints'`, schema).Scan(&tables); err != nil || tables != 1 {
				t.Fatalf("round %d: %d checkpoint tables in %s, %v; want one", round, tables, schema, err)
			}
		})
	}
}

// TestReplicasMakingTheirDurableAtOnce: every replica of a service calls
// New with the same durable as it starts (one then runs it, leader-elected);
// made at the same moment, before the durable consumer exists, each gets it
// (a NATS connection each). A pin: JetStream's create-or-update of the same
// config is safe against a concurrent creator, unlike PostgreSQL's IF NOT
// EXISTS.
func TestReplicasMakingTheirDurableAtOnce(t *testing.T) {
	t.Parallel()
	const replicas, rounds = 8, 5
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	e.appendAndRelay(t, ctx, 1)
	conns := make([]*nats.Conn, replicas)
	for i := range conns {
		conns[i] = e.connect(t)
	}
	for round := range rounds {
		// A subtest per round: its database and pools go at its end.
		t.Run(fmt.Sprintf("round %d", round), func(t *testing.T) {
			release := make(chan struct{})
			done := make(chan error, replicas)
			for _, nc := range conns {
				go func() {
					<-release
					_, err := natsconsumer.New(ctx, nc, &natsconsumer.Config{Durable: fmt.Sprintf("replicated-%d", round)})
					done <- err
				}()
			}
			close(release)
			for range replicas {
				if err := <-done; err != nil {
					t.Fatalf("round %d: New with a durable %d others make at once: %v", round, replicas-1, err)
				}
			}
		})
	}
}

// TestARoleThatMayNotCreateRunsOnAnExistingTable: a least-privilege role
// (annals grant's runner, and rights on the checkpoint table, which an
// owner made) runs RunProjection: the table is there with every column, so
// it runs no DDL. Before, every start ran CREATE SCHEMA IF NOT EXISTS,
// which PostgreSQL refuses to a role without CREATE on the database even
// when the schema is there ("permission denied for database").
func TestARoleThatMayNotCreateRunsOnAnExistingTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	e.appendAndRelay(t, ctx, 1)
	if _, err := e.dst.Pool.Exec(ctx, `CREATE TABLE annals.relay_checkpoints (
		    consumer       text        NOT NULL PRIMARY KEY,
		    stream_seq     bigint      NOT NULL,
		    position       bigint,
		    stream_created timestamptz,
		    updated_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
		    event_id       uuid)`); err != nil {
		t.Fatal(err)
	}
	role := fmt.Sprintf("annals_natsconsumer_runner_%d", time.Now().UnixNano())
	if _, err := e.dst.Pool.Exec(ctx, "CREATE ROLE "+role+" LOGIN PASSWORD 'pw-runner'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range []string{"DROP OWNED BY " + role, "DROP ROLE " + role} {
			if _, err := e.dst.Pool.Exec(context.Background(), s); err != nil {
				t.Errorf("%s: %v", s, err)
			}
		}
	})
	if err := migrations.Grant(ctx, e.dst.Pool, role, migrations.Runner, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.dst.Pool.Exec(ctx, "GRANT SELECT, INSERT, UPDATE ON annals.relay_checkpoints TO "+role); err != nil {
		t.Fatal(err)
	}
	var mayCreate bool
	if err := e.dst.Pool.QueryRow(ctx, `SELECT has_database_privilege($1, current_database(), 'CREATE')
		OR has_schema_privilege($1, 'annals', 'CREATE')`, role).Scan(&mayCreate); err != nil || mayCreate {
		t.Fatalf("the runner role may create in the database or the schema (%v, %v): the test shows nothing", mayCreate, err)
	}
	cfg, err := pgxpool.ParseConfig(e.dst.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, "pw-runner"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // before the role is dropped: cleanups run last first
	c, err := natsconsumer.New(ctx, e.nc, &natsconsumer.Config{Durable: "runner", RetryBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- c.RunProjection(rctx, pool, nothing{}) }()
	var early error
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		select {
		case early = <-done:
			if early == nil {
				early = fmt.Errorf("RunProjection returned nil before its context ended")
			}
			return true
		default:
		}
		var seq int64
		_ = e.dst.Pool.QueryRow(ctx, `SELECT stream_seq FROM annals.relay_checkpoints WHERE consumer = 'runner'`).Scan(&seq)
		return seq == 1
	})
	if early != nil {
		t.Fatalf("RunProjection as a role that may not create, on an existing checkpoint table: %v", early)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
