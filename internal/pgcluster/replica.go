package pgcluster

import (
	"context"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/cockroachdb/errors"
)

// StartReplica starts a streaming replica (a hot standby) of the server at
// primaryURL, which must accept replication connections from 127.0.0.1 (a
// cluster of this package does: initdb's default pg_hba.conf trusts local
// replication): it copies the primary with pg_basebackup -R (which writes
// primary_conninfo and standby.signal) into a fresh temporary directory and
// runs postgres on it, on another port, with the same settings as Start.
// It returns once the replica accepts (read-only) connections. Stop it like
// any Cluster. opts's Port, Fsync, Settings, BinDir and Logger apply.
func StartReplica(ctx context.Context, primaryURL string, opts *Options) (*Cluster, error) {
	if !supported {
		return nil, errors.Newf("pgcluster: not supported on %s", runtime.GOOS)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.BinDir == "" {
		dir, err := FindBinaries()
		if err != nil {
			return nil, err
		}
		o.BinDir = dir
	}
	u, err := serverUser()
	if err != nil {
		return nil, err
	}
	c := &Cluster{binDir: o.BinDir, port: o.Port, portSet: o.Port != 0, fsync: o.Fsync, user: u, logger: o.Logger}
	for k, v := range o.Settings {
		c.extra = append(c.extra, "-c", k+"="+v)
	}
	if err := c.makeDir(); err != nil {
		return nil, errors.CombineErrors(err, c.cleanup())
	}
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, "pg_basebackup"),
		"-d", primaryURL, "-D", c.dataDir, "-R", "-X", "stream", "-c", "fast", "--no-sync")
	cmd.Dir = c.dir
	cmd.Env = childEnv()
	cmd.SysProcAttr = procAttr(c.user, syscall.SIGKILL)
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, errors.CombineErrors(errors.Wrapf(err, "pgcluster: pg_basebackup failed:\n%s", tail(string(out), 30)), c.cleanup())
	}
	if err := c.startWithPortRetry(ctx); err != nil {
		return nil, errors.CombineErrors(err, c.cleanup())
	}
	c.logger.InfoContext(ctx, "pgcluster: replica started", slog.String("url", c.URL()), slog.String("primary", primaryURL),
		slog.Duration("took", time.Since(start)))
	return c, nil
}
