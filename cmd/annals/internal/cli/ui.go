package cli

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel"

	"github.com/annals-dev/annals/console"
)

func (e *env) uiCommand() *cobra.Command {
	var listen, token, basePath, sessionKeyFile string
	var readOnly bool
	var staleAfter time.Duration
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the operator console (web UI), /metrics, /healthz and /readyz",
		Long: `Serve the operator console on --listen: an overview (head, append rate, subscribers
with lag, leaders and state, dead-letter counts), streams and events (search by prefix,
the whole log paged by position, type filter, live follow), subscriber detail (partitions,
checkpoints, failures in progress, checkpoint set), dead letters (list, show, retry, skip,
purge), the scheduler (cron tasks, timers), runner instances and the audit log.

Reading needs no sign-in. Changing anything needs an operator: start with --auth-token
(at least 16 characters; or $ANNALS_UI_TOKEN, which keeps the token out of the process
list) and sign in with it; API clients may send "Authorization: Bearer TOKEN", with
"X-Annals-Actor: NAME" for the name the audit log records ("token" without it). The
database role must have the operator privileges ('annals grant operator ROLE'); every
change is recorded in the audit_log table. --read-only shows everything and changes
nothing. Sign-ins and forms are signed with a key random to this process: give replicas
behind one load balancer the same --session-key-file (at least 32 random bytes, e.g.
'openssl rand -hex 32'), so that they accept each other's and a restart keeps them; a
new token signs everyone out.

The same server answers /metrics (Prometheus text format), /healthz (the process is up)
and /readyz (the database answers); docs/operations.md lists the series.`,
		Example: `  ANNALS_UI_TOKEN=$(openssl rand -hex 16) annals ui --listen 127.0.0.1:8080
  annals ui --read-only --listen :8080`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if token == "" {
				token = e.getenv("ANNALS_UI_TOKEN")
			}
			if token != "" && len(token) < 16 {
				return usagef("--auth-token must be at least 16 characters")
			}
			if err := console.CheckBasePath(basePath); err != nil {
				return usagef("--base-path %v", err)
			}
			if staleAfter <= 0 {
				return usagef("--stale-after must be positive")
			}
			var sessionKey []byte
			if sessionKeyFile != "" {
				b, err := os.ReadFile(sessionKeyFile)
				if err != nil {
					return usagef("--session-key-file: %v", err)
				}
				if sessionKey = bytes.TrimRight(b, " \t\r\n"); len(sessionKey) < console.MinSessionKey {
					return usagef("--session-key-file %s holds %d bytes; the key must be at least %d (e.g. openssl rand -hex 32)",
						sessionKeyFile, len(sessionKey), console.MinSessionKey)
				}
			}
			ctx := cmd.Context()
			pool, err := e.connect(ctx, 8)
			if err != nil {
				return err
			}
			defer pool.Close()
			metrics, err := console.NewMetrics(pool, &console.MetricsConfig{Schema: e.schema, StaleAfter: staleAfter})
			if err != nil {
				return err
			}
			defer func() { _ = metrics.Shutdown(context.Background()) }()
			// Instruments of this process (none run here today, but a
			// library call made by a plugin would report) go to /metrics.
			otel.SetMeterProvider(metrics.MeterProvider())
			con, err := console.New(pool, &console.Config{Schema: e.schema, ReadOnly: readOnly, AuthToken: token, SessionKey: sessionKey,
				BasePath: basePath, StaleAfter: staleAfter, Metrics: metrics})
			if err != nil {
				return err
			}
			var h http.Handler = con
			if basePath != "" {
				mux := http.NewServeMux()
				mux.Handle(basePath+"/", http.StripPrefix(basePath, con))
				mux.Handle("GET /metrics", metrics)
				mux.Handle("GET /healthz", console.Liveness())
				mux.Handle("GET /readyz", console.Readiness(pool, &console.HealthConfig{Schema: e.schema}))
				h = mux
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return usagef("--listen %q: %v", listen, err)
			}
			srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
			mode := "operators may sign in with the token"
			switch {
			case readOnly:
				mode = "read-only"
			case token == "":
				mode = "no --auth-token: nobody can change anything"
			}
			fmt.Fprintf(e.stdout, "annals ui: serving http://%s%s/ (%s); Ctrl-C stops\n", ln.Addr(), basePath, mode)
			errc := make(chan error, 1)
			go func() { errc <- srv.Serve(ln) }()
			select {
			case err := <-errc:
				return errors.Wrap(err, "serve")
			case <-ctx.Done():
			}
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:8080", "address to serve on")
	cmd.Flags().StringVar(&token, "auth-token", "", "operator token, at least 16 characters (default $ANNALS_UI_TOKEN); without one nobody can change anything")
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "show everything, change nothing")
	cmd.Flags().StringVar(&sessionKeyFile, "session-key-file", "", "file holding the key (at least 32 random bytes) that signs sign-ins and forms: the same for every replica (default: random per process)")
	cmd.Flags().StringVar(&basePath, "base-path", "", "serve the console under this path (e.g. /annals, behind a proxy)")
	cmd.Flags().DurationVar(&staleAfter, "stale-after", defaultStaleAfter, "an instance whose last heartbeat is older than this is stale")
	return cmd
}
