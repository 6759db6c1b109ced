// Package projectioncmd is a cobra command tree that a service mounts into
// its own binary to inspect and rebuild the projections its Runner
// registers. Rebuilds need the service's projection code, so they cannot be
// a subcommand of the generic annals CLI; this package gives every service
// the same commands instead:
//
//	runner, _ := projection.NewRunner(pool, nil)
//	_ = runner.Register(balances, nil)
//	root := &cobra.Command{Use: "myservice"}
//	root.AddCommand(projectioncmd.New(runner, pool, nil))
//
//	myservice projections list               # checkpoint, head, lag, leader of each
//	myservice projections status [NAME]      # the same per partition, with stops and dead letters
//	myservice projections rebuild NAME [--yes] [--batch-size N] [--lock-timeout D]
//	myservice projections generations NAME [--output text|json|jsonl]  # blue/green read models
//	myservice projections rollback NAME [--yes]                         # back to the previous generation
//
// A service whose client is built from its own flags cannot have the runner
// when it mounts the tree (cobra parses the flags later): mount it with
// New(nil, nil, &Config{Open: …}), and Open builds the service and returns
// its runner and pool once a command runs (not for help). Without a runner
// and without Open, each command fails with ErrNoRunner.
//
// For a projection registered with projection.Options.BlueGreen, rebuild runs
// projection.Runner.RebuildBlueGreen (a new generation replayed beside the
// live one, then a cut-over) instead of the in-place rebuild.
//
// list and status read the checkpoints table, the head of the log, the
// instances' heartbeats and the advisory locks, and name a partition's
// leader by the rule of `annals status` (package internal/leadership): the
// lock has the last word ("none" while it is free, whatever a heartbeat
// still lists); while some session holds it, the live instance whose
// heartbeat lists the partition leads, unless another has claimed the
// checkpoint since, else the checkpoint's owner; lag is the head minus the
// checkpoint, in positions (an upper bound on the events still to process,
// since events of other types, and holes left by rolled-back appends, count
// too). An instance is live while its last heartbeat is younger than
// --stale-after, by default three heartbeats of the service's runner
// (projection.Config.HeartbeatInterval: 30 s at its default of 10 s, as
// `annals status`).
//
// rebuild runs projection.Runner.Rebuild in the command's process while the
// service's instances keep running: they stand by during the rebuild and
// take over afterwards. It asks for confirmation on a terminal unless --yes
// is given, and refuses to run without --yes when stdin is not a terminal
// (a script must say what it means). Progress goes to stderr: a bar redrawn
// in place on a terminal, otherwise a plain line every ProgressInterval (2 s
// by default) and one at the end; the summary goes to stdout.
//
// # Errors and exit codes
//
// Every mistake in the command line returns an error matching ErrUsage
// (errors.Is), and nothing changes: an unknown or malformed flag, a
// --batch-size outside 1..1000000 or a non-positive --lock-timeout, a
// missing or extra argument, a mistyped subcommand, a NAME that is not
// registered (or, for rebuild, is an observer or cannot reset its read
// model), and rebuild without --yes when stdin is not a terminal. Map it to
// exit code 2 and other errors to 1, as the annals CLI does. An operator
// answering no at the prompt gets ErrNotConfirmed alone (not a usage error).
// cobra prints a usage error's command usage after it (unless the root sets
// SilenceUsage); an error met while a command runs (a database that is
// not migrated, a rebuild refused) is printed alone, whatever the root's
// SilenceUsage.
//
// Interrupting the command (its context ends) stops the rebuild after the
// batch in hand is rolled back; a live instance continues the replay from
// the last committed batch, so nothing is lost or applied twice. The
// command's error then says the rebuild was interrupted and matches the
// context's error (errors.Is(err, context.Canceled) after a Ctrl-C), not
// the cancelled statement or lost lock that followed.
package projectioncmd
