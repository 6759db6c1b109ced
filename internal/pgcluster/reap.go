package pgcluster

import (
	"bufio"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/annals-dev/annals/internal/telemetry"
)

// reapStale removes the directories of clusters whose owner died without
// calling Stop. The owner holds an flock on the directory's owner file for
// the cluster's whole life and the kernel releases it when the owner dies,
// so a lock that can be taken marks a dead owner (this holds across PID
// namespaces, unlike a PID check). A directory whose postmaster is still
// running, or that has no owner file yet (being created), is left alone.
func reapStale(logger *slog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*")) // the pattern is valid
	for _, dir := range dirs {
		if reapable(dir) {
			if err := os.RemoveAll(dir); err != nil {
				logger.Debug("pgcluster: could not remove a stale cluster", slog.String("dir", dir), telemetry.Err(err))
				continue
			}
			logger.Info("pgcluster: removed a stale cluster left by a dead process", slog.String("dir", dir))
		}
	}
}

func reapable(dir string) bool {
	f, err := os.OpenFile(filepath.Join(dir, ownerFile), os.O_RDWR, 0)
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }() // releases the lock if we took it
	if ok, err := tryLock(f); !ok || err != nil {
		return false
	}
	return !alive(postmasterPID(filepath.Join(dir, "data")))
}

// postmasterPID reads the first line of postmaster.pid; 0 when there is none.
func postmasterPID(dataDir string) int {
	f, err := os.Open(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(sc.Text()))
	return pid
}
