// Package annals is the entry point of annals, an event-sourcing framework
// on PostgreSQL: one Client holds the event registry, the store, the
// runner of projections, observers and sagas, and the scheduler of timers
// and cron tasks, sharing one pool, schema, clock, logger and telemetry.
//
//	client, err := annals.New(pool, &annals.Config{Registry: reg})
//	err = annals.AddProjection(client, balances, nil) // typed: projection.Projection
//	err = annals.AddSaga(client, orders, nil)         // saga.Saga[S]
//	err = client.Start(ctx)                           // migrate, set up read models, run
//	defer client.Stop(ctx)
//	_, err = client.Append(ctx, "account-42", eventstore.NoStream, eventstore.NewEvent(Opened{}))
//
// Each kind of handler has its own registration function (AddProjection,
// AddObserver, AddSaga, AddTask, AddService), typed by what it registers.
// Start migrates the schema (unless Config.SkipMigrations), stores the cron
// tasks, runs each projection's read-model setup (projection.Typed.OnSetup)
// and the runner's start-up checks (a subscriber's partition layout, say),
// returning the first failure with nothing running, and starts the runner
// and the scheduler's dispatcher in the background; Stop shuts them down
// gracefully. Run is Start, then Stop when its context
// ends. RunUntilCaughtUp processes to the head and returns, for tests and
// batch jobs.
//
// The sub-packages stay usable on their own (the Client only wires them):
//
//	eventstore   append and read events, typed registry
//	migrations   create and upgrade the schema
//	projection   projections and observers, the Runner, rebuilds, read-model setup
//	saga         sagas with typed state, effects and timers
//	scheduler    timers (delayed appends) and cron tasks
//	aggregate    DDD repositories with snapshots
//	catchup      the subscription engine under the Runner
//	checkpoint   checkpoints with fencing epochs
//	advisorylock md5-keyed leader election
//	deadletter   inspect and act on dead letters
//	failure      the Permanent error mark (re-exported here)
//	annalstest   test harness; testkit: Given/When/Then and replays
//
// See README.md and docs/ (recipes.md first) for the guarantees and operations.
package annals
