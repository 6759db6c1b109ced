package cli

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/internal/pgcluster"
	"github.com/annals-dev/annals/migrations"
)

// annals status lists the physical standbys streaming from the server
// (the read replica of a runner's ReadPool) with how far behind each has
// replayed, in the text and in --output json; a role without
// pg_read_all_stats sees that there is one, its details hidden, and is told
// why. A cluster of its own: a replica of the shared test cluster would
// replay every other test's WAL.
func TestStatusListsStandbys(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cluster, pool := annalstest.PrivateCluster(t, ctx, nil)
	if _, err := migrations.Up(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	if st := statusJSON(t, cluster.URL()); len(st.Standbys) != 0 {
		t.Fatalf("standbys before any: %+v", st.Standbys)
	}
	replica, err := pgcluster.StartReplica(ctx, cluster.URL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = replica.Stop(t.Context()) })
	if r := annals(t, cluster.URL(), "append", "s-1", "t.x", `{"n":1}`); r.code != 0 {
		t.Fatalf("append: %+v", r)
	}
	var st StatusJSON
	annalstest.WaitFor(t, 30*time.Second, func() bool {
		st = statusJSON(t, cluster.URL())
		return len(st.Standbys) == 1 && st.Standbys[0].State != nil && *st.Standbys[0].State == "streaming" &&
			st.Standbys[0].ReplayLagBytes != nil && *st.Standbys[0].ReplayLagBytes == 0
	})
	sb := st.Standbys[0]
	if sb.PID == 0 || sb.ApplicationName == nil || sb.SyncState == nil || *sb.SyncState != "async" || sb.ClientAddr == nil {
		t.Fatalf("standby: %+v", sb)
	}
	r := annals(t, cluster.URL(), "status")
	if r.code != 0 {
		t.Fatalf("status: %+v", r)
	}
	if l := tableLine(t, r.stdout, "STANDBY"); l != "STANDBY PID ADDRESS STATE SYNC REPLAY LAG REPLAY LAG TIME" {
		t.Errorf("header: %q", l)
	}
	// The lag may have moved since (PostgreSQL's own background WAL), and
	// its time is "-" for a moment when new WAL follows an idle spell.
	want := regexp.MustCompile(fmt.Sprintf(`^%s %d %s streaming async [0-9.]+ (B|KiB|MiB) ([0-9.a-z]+|-)$`,
		regexp.QuoteMeta(*sb.ApplicationName), sb.PID, regexp.QuoteMeta(*sb.ClientAddr)))
	if l := tableLine(t, r.stdout, *sb.ApplicationName, fmt.Sprint(sb.PID)); !want.MatchString(l) {
		t.Errorf("standby line %q, want %s:\n%s", l, want, r.stdout)
	}

	// A logical walsender (what annals' WAL sources run) is no standby.
	bin, err := pgcluster.FindBinaries()
	if err != nil {
		t.Fatal(err)
	}
	recv := exec.CommandContext(ctx, filepath.Join(bin, "pg_recvlogical"), "-d", cluster.URL(), "-S", "status_logical",
		"--create-slot", "--start", "-P", "test_decoding", "--if-not-exists", "-f", os.DevNull)
	if err := recv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = recv.Process.Kill(); _ = recv.Wait() })
	annalstest.WaitFor(t, 30*time.Second, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication`).Scan(&n)
		return err == nil && n == 2
	})
	if st := statusJSON(t, cluster.URL()); len(st.Standbys) != 1 || st.Standbys[0].PID != sb.PID {
		t.Fatalf("standbys with a logical walsender streaming too: %+v", st.Standbys)
	}

	// A reader role: it sees a standby, not its details.
	if _, err := pool.Exec(ctx, `CREATE ROLE status_reader LOGIN`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Grant(ctx, pool, "status_reader", migrations.Reader, nil); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(cluster.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User("status_reader")
	reader := u.String()
	rst := statusJSON(t, reader)
	if len(rst.Standbys) != 1 || rst.Standbys[0].State != nil || rst.Standbys[0].ReplayLagBytes != nil {
		t.Fatalf("standbys as a reader: %+v", rst.Standbys)
	}
	r = annals(t, reader, "status")
	if r.code != 0 || !strings.Contains(r.stdout, "hidden from this role: grant it pg_read_all_stats") {
		t.Errorf("status as a reader: %+v", r)
	}
}
