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
//
// list and status read the checkpoints table, the head of the log and the
// advisory locks: a partition's leader is the checkpoint's owner while some
// session holds its lock ("none" otherwise); lag is the head minus the
// checkpoint, in positions (an upper bound on the events still to process,
// since events of other types, and holes left by rolled-back appends, count
// too).
//
// rebuild runs projection.Runner.Rebuild in the command's process while the
// service's instances keep running: they stand by during the rebuild and
// take over afterwards. It asks for confirmation on a terminal unless --yes
// is given, and refuses to run without --yes when stdin is not a terminal
// (a script must say what it means). Progress goes to stderr: a bar redrawn
// in place on a terminal, otherwise a plain line every ProgressInterval (2 s
// by default) and one at the end; the summary goes to stdout.
//
// Interrupting the command (its context ends) stops the rebuild after the
// batch in hand is rolled back; a live instance continues the replay from
// the last committed batch, so nothing is lost or applied twice.
package projectioncmd
