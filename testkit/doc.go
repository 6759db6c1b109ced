// Package testkit is the test kit for applications built on annals: it
// tests the three kinds of code a service writes — aggregates, projections
// and sagas — from the events they take and produce, against a real
// PostgreSQL where a database is involved.
//
// # Aggregates: Given, When, Then
//
// Aggregate rules are tested in memory, without a database: given the
// events already in the aggregate's stream, when a command runs, then it
// records these events, or fails with this error ([Given],
// [AggregateScenario]):
//
//	testkit.Given(t, NewAccount, Opened{Owner: "Ann"}, Deposited{Amount: 100}).
//		When(func(a *Account) error { return a.Withdraw(130) }).
//		ThenError(ErrInsufficientFunds)
//
// WithRegistry sends the history through JSON and the registry (upcasters
// included), as the store would, and checks that every recorded event reads
// back as itself, so an unregistered type or a field that does not survive
// encoding fails the test, named; the recorded events are compared with the
// expected ones as recorded, as the store would tell them apart (a
// time.Time by its JSON encoding, so that a time carried over from the
// history equals the one given, whatever zone it came back in). A field of
// type any must hold what encoding/json decodes into one (float64, string,
// bool, nil, map[string]any, []any): an int in it reads back as a float64,
// and the test fails, saying so.
//
// # Projections and observers: ReplayProjection
//
// [ReplayProjection] replays events through a projection (or an observer,
// or anything projection.Runner.Register accepts) into a fresh migrated
// database and returns it, with the read model built, for the test to
// query:
//
//	func TestBalances(t *testing.T) {
//		t.Parallel()
//		r := testkit.ReplayProjection(t, newBalances(reg), nil,
//			testkit.Stream("account-1", Opened{Owner: "Ann"}, Deposited{Amount: 100}),
//			testkit.Stream("account-2", Opened{Owner: "Bob"}),
//		)
//		var amount int
//		if err := r.Pool.QueryRow(t.Context(), `SELECT amount FROM balances WHERE account = 'account-1'`).Scan(&amount); err != nil {
//			t.Fatal(err)
//		}
//		…
//	}
//
// The replay is the production path, not a simulation of it: the events go
// through eventstore (so they are encoded, validated and numbered as in
// production) and the handler runs under projection.Runner.RunUntilCaughtUp,
// in the runner's transactions, with its checkpoints. The events' registry
// is ReplayOptions.Registry, by default the one the handler was built with
// (projection.New(name, reg), projection.NewObserver, saga.New), so a nil
// *ReplayOptions does for a typed handler; it is the runner's registry too,
// as an annals.Client's is, so untyped handlers also get events upcast to
// their current schema version. The
// read model's tables come from ReplayOptions.Setup, the projection's own setup
// (projection.Setupper: Typed.OnSetup) and its Reset (projection.Resetter),
// which run first, as a rebuild would run them: a projection with an
// OnSetup needs no set-up in its tests. [Replay.Append] appends more events and
// continues from the checkpoint, for tests of incremental updates.
//
// Events are appended as the store appends them, so an
// eventstore.EventData of a type with upcasters is stamped with the type's
// current schema version, and is not upcast, unless its Metadata says
// otherwise (unlike a history given to Given, where it is at version 1). To
// replay an event in an old stored shape, give its version:
//
//	eventstore.EventData{Type: "account.opened", Data: json.RawMessage(`{"name":"Ann"}`),
//		Metadata: eventstore.Metadata{Extra: map[string]any{eventstore.SchemaVersionKey: 1}}}
//
// The first handler error or panic fails the test at once, quoting the
// error and the event (no retries: the kit registers the handler with
// projection.Stop and no retry policy unless ReplayOptions.Options says
// otherwise). Bad events (an unregistered type, an empty stream ID) fail it
// before a database is made.
//
// Each replay gets its own database, cloned from a template, so tests may
// run in parallel (t.Parallel) and never see each other's events. A replay
// of 100 events into a fresh database takes about 0.15–0.3 s on a busy
// 2-core machine, two thirds of it the CREATE DATABASE of the fresh
// database (see BenchmarkReplayProjection100). The server is annalstest's: set
// ANNALS_TEST_DATABASE_URL to an admin URL, or let annalstest start a
// throwaway cluster from the local PostgreSQL binaries; call
// annalstest.Main from TestMain so that cluster is stopped at the end:
//
//	func TestMain(m *testing.M) { annalstest.Main(m) }
//
// examples/bank/main_test.go uses the whole kit on a small service.
//
// # Sagas: ReplaySaga
//
// [ReplaySaga] replays events through a saga the same way (saga.Register on
// a runner, RunUntilCaughtUp, in a fresh database), with a scheduler on a
// [FakeClock], and returns what the saga made of them: its instances'
// state ([SagaReplay.Instance]), the effects it appended
// ([SagaReplay.Effects]) and its timers ([SagaReplay.Timers]).
// [SagaReplay.Advance] moves the clock as time would pass, stepping through
// each timer's due time and each tick of the cron tasks added to
// SagaReplay.Scheduler, and fires each when it falls due, which the saga
// then handles; [SagaReplay.Append] adds events; [SagaReplay.Find] tells
// whether an instance exists. Its
// options embed ReplayOptions (nil options take the registry of saga.New),
// and failures are reported as for projections.
//
// The fake clock starts at [DefaultSagaStart] (2030-01-01 UTC) unless
// SagaReplayOptions.Start says otherwise: a due date the saga reads from an
// event and that lies before the clock's time (a realistic date in a test
// written today) makes a timer that is due at once, which any Advance, even
// Advance(0), fires. Give events dates relative to r.Clock.Now() or to the
// Start you set. (Timers report CreatedAt by the database's clock.)
package testkit
