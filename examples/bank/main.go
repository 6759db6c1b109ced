// Command bank is a small event-sourced bank service built on annals: an
// Account aggregate (open, deposit, withdraw, never below zero), a
// transactional read model of balances (the bank.balances projection), an
// observer that notifies large withdrawals.
//
//	bank [demo]   run the demo end to end (the default)
//
// It uses the database at DATABASE_URL (migrating the annals schema first),
// or run it with a throwaway PostgreSQL: make demo.
//
// Files: account.go (events and aggregate), balances.go and balances.sql
// (the projection), notify.go (the observer), service.go (wiring),
// demo.go (the demo), main.go (commands).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

// run executes the command line args and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	root := rootCommand(stdout, getenv)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(stderr, "bank: %v\n", err)
		return 1
	}
	return 0
}

func rootCommand(stdout io.Writer, getenv func(string) string) *cobra.Command {
	demo := func(cmd *cobra.Command, _ []string) error {
		return runDemo(cmd.Context(), stdout, getenv("DATABASE_URL"), serviceOptions{})
	}
	root := &cobra.Command{
		Use:   "bank",
		Short: "An event-sourced bank service on annals (runs the demo without a command)",
		Long: `bank is the annals example service. Without a command it runs the demo.
It uses the database at $DATABASE_URL.`,
		Args:          cobra.NoArgs,
		RunE:          demo,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(&cobra.Command{
		Use:   "demo",
		Short: "Run commands → events → read model end to end, then rebuild the read model",
		Args:  cobra.NoArgs,
		RunE:  demo,
	})
	return root
}
