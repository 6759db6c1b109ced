package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/cockroachdb/errors"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/projection/projectioncmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv))
}

// run executes the command line args and returns the exit code: 0, 1 for
// a failure, 2 for a mistake in the command line.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	out := &syncWriter{w: stdout} // the observer prints from the runner's goroutine
	svc, err := newService(getenv("DATABASE_URL"), serviceOptions{out: out})
	switch {
	case errors.Is(err, errNoDatabase):
		svc = nil // commands say so when run; help works without a database
	case err != nil:
		fmt.Fprintf(stderr, "bank: %v\n", err)
		return 1
	default:
		defer svc.Close()
	}
	root := rootCommand(svc, out)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(out)
	root.SetErr(stderr)
	err = root.ExecuteContext(ctx)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage), errors.Is(err, projectioncmd.ErrUsage):
		fmt.Fprintf(stderr, "bank: %v\n", err)
		return 2 // a mistake in the command line; nothing was done
	default:
		fmt.Fprintf(stderr, "bank: %v\n", err)
		return 1
	}
}

// errUsage marks the bank's own command-line mistakes (an unknown command,
// a bad flag, an extra argument); with projectioncmd.ErrUsage, the exit
// code is 2.
var errUsage = errors.New("bank: usage error")

// noArgs is cobra.NoArgs, its error marked errUsage.
func noArgs(cmd *cobra.Command, args []string) error {
	if err := cobra.NoArgs(cmd, args); err != nil {
		return errors.Mark(err, errUsage)
	}
	return nil
}

// rootCommand is the command tree; svc is nil without DATABASE_URL.
func rootCommand(svc *service, out io.Writer) *cobra.Command {
	demo := func(cmd *cobra.Command, _ []string) error {
		if svc == nil {
			return errNoDatabase
		}
		return runDemo(cmd.Context(), svc, out)
	}
	root := &cobra.Command{
		Use:   "bank",
		Short: "An event-sourced bank service on annals (runs the demo without a command)",
		Long: `bank is the annals example service. Without a command it runs the demo.
It uses the database at $DATABASE_URL.`,
		Args:          noArgs,
		RunE:          demo,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return errors.Mark(err, errUsage) })
	root.AddCommand(&cobra.Command{
		Use:   "demo",
		Short: "Run commands → events → read model end to end, then rebuild the read model",
		Args:  noArgs,
		RunE:  demo,
	})
	// The operators' commands, on the service's own runner: they know its
	// projections. Without a database the tree is still mounted, so that
	// help works; its pre-run hook refuses to run a command. (projectioncmd
	// uses the runner and the pool only when a command runs.)
	var projections *cobra.Command
	if svc == nil {
		projections = projectioncmd.New(nil, nil, nil)
	} else {
		projections = projectioncmd.New(svc.client.Runner(), svc.pool, nil)
	}
	projections.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		switch {
		case cmd == projections:
			return nil // help
		case svc == nil:
			return errNoDatabase
		case cmd.Name() == "rebuild":
			// Rebuild writes: it migrates first, as the service does (the
			// rebuild sets bank_balances up itself). list and status only
			// read, and report an unmigrated database.
			return svc.client.Migrate(cmd.Context())
		}
		return nil
	}
	root.AddCommand(projections)
	return root
}
