package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/internal/pgcluster"
	"github.com/annals-dev/annals/migrations"
)

func (e *env) devCommand() *cobra.Command {
	var fsync, replica bool
	var port, replicaPort int
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

--replica also starts a streaming replica (a hot standby made with pg_basebackup of the
migrated cluster, on --replica-port) and gives its URL as DATABASE_READ_URL: for
'annals tail --read-url', projection.Config.ReadPool and trying what a lagging replica
does (pg_wal_replay_pause() on it). It is stopped and deleted with the cluster.

Without COMMAND, stdout gets one line once the cluster is ready: DATABASE_URL=URL (a
line for the shell; with --replica, DATABASE_READ_URL=URL after it on the same line), or
with --output json one object on one line with database_url, port, data_dir and fsync
(and read_url, read_port); everything else goes to stderr.`,
		Example: `  annals dev
  annals dev --output json > /tmp/dev.json &   # read database_url from the first line
  annals dev --fsync=false -- go test ./...
  annals dev --replica -- sh -c 'annals tail --read-url "$DATABASE_READ_URL"'`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := e.validSchema(); err != nil {
				return err
			}
			if port < 0 || port > 65535 {
				return usagef("--port %d is not a TCP port", port)
			}
			if replicaPort < 0 || replicaPort > 65535 {
				return usagef("--replica-port %d is not a TCP port", replicaPort)
			}
			if cmd.Flags().Changed("replica-port") && !replica {
				return usagef("--replica-port needs --replica")
			}
			if replica && replicaPort != 0 && replicaPort == port {
				return usagef("--replica-port must differ from --port")
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
			ready := devReady{DatabaseURL: url, Port: cluster.Port(), DataDir: cluster.DataDir(), Fsync: fsync}
			if replica {
				// After the migration, so that the copy has the schema.
				fmt.Fprintln(e.stderr, "annals dev: starting a streaming replica (pg_basebackup) ...")
				rc, err := pgcluster.StartReplica(ctx, url, &pgcluster.Options{Fsync: fsync, Port: replicaPort})
				if err != nil {
					return errors.Wrap(err, "start the replica")
				}
				defer func() { // before the primary's (deferred calls run last first)
					sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
					defer cancel()
					if err := rc.Stop(sctx); err != nil {
						fmt.Fprintf(e.stderr, "annals dev: stopping the replica: %v\n", err)
					}
				}()
				ready.ReadURL, ready.ReadPort = rc.URL(), rc.Port()
			}
			if len(args) == 0 {
				fmt.Fprintf(e.stderr, "annals dev: PostgreSQL is ready (data in %s); Ctrl-C stops and deletes it.\n", cluster.DataDir())
				if *format == outputJSON {
					// One line, so that a script reading the first line has it all.
					b, err := json.Marshal(ready)
					if err != nil {
						return errors.Wrap(err, "encode JSON")
					}
					fmt.Fprintf(e.stdout, "%s\n", b)
				} else if replica {
					fmt.Fprintf(e.stdout, "DATABASE_URL=%s DATABASE_READ_URL=%s\n", url, ready.ReadURL)
				} else {
					fmt.Fprintf(e.stdout, "DATABASE_URL=%s\n", url)
				}
				<-ctx.Done()
				fmt.Fprintln(e.stderr, "annals dev: stopping ...")
				return nil
			}
			fmt.Fprintf(e.stderr, "annals dev: DATABASE_URL=%s\n", url)
			if replica {
				fmt.Fprintf(e.stderr, "annals dev: DATABASE_READ_URL=%s\n", ready.ReadURL)
			}
			return e.runChild(ctx, url, ready.ReadURL, args)
		},
	}
	cmd.Flags().BoolVar(&fsync, "fsync", true, "keep fsync on (turn off for fast, non-durable test clusters)")
	cmd.Flags().IntVar(&port, "port", 0, "TCP port on 127.0.0.1 (0: pick a free one)")
	cmd.Flags().BoolVar(&replica, "replica", false, "also start a streaming replica of the cluster (DATABASE_READ_URL)")
	cmd.Flags().IntVar(&replicaPort, "replica-port", 0, "with --replica: its TCP port on 127.0.0.1 (0: pick a free one)")
	format = addOutputFlag(cmd, false, outputText, outputJSON)
	return cmd
}

// devReady is what annals dev --output json prints once the cluster is ready.
type devReady struct {
	DatabaseURL string `json:"database_url"`
	Port        int    `json:"port"`
	DataDir     string `json:"data_dir"`
	Fsync       bool   `json:"fsync"`
	// ReadURL and ReadPort are the replica's, with --replica.
	ReadURL  string `json:"read_url,omitempty"`
	ReadPort int    `json:"read_port,omitempty"`
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

// runChild runs args with the cluster's URL (and its replica's, readURL,
// unless empty) in its environment and turns its exit status into ours. A
// signal to us is passed on as SIGTERM.
func (e *env) runChild(ctx context.Context, url, readURL string, args []string) error {
	c := exec.CommandContext(ctx, args[0], args[1:]...)
	c.Stdin, c.Stdout, c.Stderr = e.stdin, e.rawStdout, e.rawStderr
	// Without a replica, none inherited from our environment either: it
	// would name another cluster's.
	c.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "DATABASE_READ_URL=") })
	c.Env = append(c.Env, "DATABASE_URL="+url, "ANNALS_TEST_DATABASE_URL="+url)
	if readURL != "" {
		c.Env = append(c.Env, "DATABASE_READ_URL="+readURL)
	}
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
