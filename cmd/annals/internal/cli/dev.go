package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/internal/pgcluster"
	"github.com/annals-dev/annals/migrations"
)

func (e *env) devCommand() *cobra.Command {
	var fsync bool
	var port int
	var format *string
	cmd := &cobra.Command{
		Use:   "dev [-- COMMAND [ARG...]]",
		Short: "Start a throwaway local PostgreSQL, migrate it and print its URL",
		Long: `Start a throwaway PostgreSQL cluster from the local server binaries (initdb and
postgres on PATH or under /usr/lib/postgresql/*/bin), apply the annals migrations and
print its URL. Without COMMAND it runs until interrupted (Ctrl-C) and then deletes the
cluster. With COMMAND it runs the command with DATABASE_URL and ANNALS_TEST_DATABASE_URL
set to the cluster, deletes the cluster and exits with the command's exit code.

--fsync=false trades durability for speed (tests); leave it on to measure performance.

Without COMMAND, stdout gets one line once the cluster is ready: DATABASE_URL=URL (a
line for the shell), or with --output json one object on one line with database_url, port, data_dir
and fsync; everything else goes to stderr.`,
		Example: `  annals dev
  annals dev --output json > /tmp/dev.json &   # read database_url from the first line
  annals dev --fsync=false -- go test ./...`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := e.validSchema(); err != nil {
				return err
			}
			if port < 0 || port > 65535 {
				return usagef("--port %d is not a TCP port", port)
			}
			if cmd.ArgsLenAtDash() > 0 {
				return usagef("put the command after --, e.g. annals dev -- go test ./...")
			}
			if len(args) > 0 && *format != outputText {
				return usagef("--output applies without COMMAND only: with one, the command's output is all there is")
			}
			ctx := cmd.Context()
			fmt.Fprintln(e.stderr, "annals dev: starting a throwaway PostgreSQL cluster ...")
			cluster, err := pgcluster.Start(ctx, &pgcluster.Options{Fsync: fsync, Port: port})
			if err != nil {
				return err
			}
			defer func() {
				sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
				defer cancel()
				if err := cluster.Stop(sctx); err != nil {
					fmt.Fprintf(e.stderr, "annals dev: stopping the cluster: %v\n", err)
				}
			}()
			if err := migrate(ctx, cluster.URL(), e.schema); err != nil {
				return err
			}
			url := cluster.URL()
			if len(args) == 0 {
				fmt.Fprintf(e.stderr, "annals dev: PostgreSQL is ready (data in %s); Ctrl-C stops and deletes it.\n", cluster.DataDir())
				if *format == outputJSON {
					// One line, so that a script reading the first line has it all.
					b, err := json.Marshal(devReady{DatabaseURL: url, Port: cluster.Port(), DataDir: cluster.DataDir(), Fsync: fsync})
					if err != nil {
						return errors.Wrap(err, "encode JSON")
					}
					fmt.Fprintf(e.stdout, "%s\n", b)
				} else {
					fmt.Fprintf(e.stdout, "DATABASE_URL=%s\n", url)
				}
				<-ctx.Done()
				fmt.Fprintln(e.stderr, "annals dev: stopping ...")
				return nil
			}
			fmt.Fprintf(e.stderr, "annals dev: DATABASE_URL=%s\n", url)
			return e.runChild(ctx, url, args)
		},
	}
	cmd.Flags().BoolVar(&fsync, "fsync", true, "keep fsync on (turn off for fast, non-durable test clusters)")
	cmd.Flags().IntVar(&port, "port", 0, "TCP port on 127.0.0.1 (0: pick a free one)")
	format = addOutputFlag(cmd, false, outputText, outputJSON)
	return cmd
}

// devReady is what annals dev --output json prints once the cluster is ready.
type devReady struct {
	DatabaseURL string `json:"database_url"`
	Port        int    `json:"port"`
	DataDir     string `json:"data_dir"`
	Fsync       bool   `json:"fsync"`
}

func migrate(ctx context.Context, url, schema string) error {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return errors.Wrap(err, "connect to the throwaway cluster")
	}
	defer pool.Close()
	_, err = migrations.Up(ctx, pool, &migrations.Config{Schema: schema})
	return err
}

// runChild runs args with the cluster's URL in its environment and turns its
// exit status into ours. A signal to us is passed on as SIGTERM.
func (e *env) runChild(ctx context.Context, url string, args []string) error {
	c := exec.CommandContext(ctx, args[0], args[1:]...)
	c.Stdin, c.Stdout, c.Stderr = e.stdin, e.rawStdout, e.rawStderr
	c.Env = append(os.Environ(), "DATABASE_URL="+url, "ANNALS_TEST_DATABASE_URL="+url)
	c.Cancel = func() error { return c.Process.Signal(syscall.SIGTERM) }
	c.WaitDelay = 30 * time.Second
	err := c.Run()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &exitErr):
		code := exitErr.ExitCode()
		if code < 0 {
			code = ExitFailure
		}
		return exitError{code: code}
	}
	return errors.Wrapf(err, "run %s", args[0])
}
