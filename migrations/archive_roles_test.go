package migrations_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/archive"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
)

// Only an operator archives (the run records the operator's role); writers
// and readers cannot, nor write events_archive directly; readers read the
// archived events like the rest of the log, and writers' appends look
// archived event IDs up.
func TestArchiveRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	writer := newRole(t, db, migrations.Writer)
	reader := newRole(t, db, migrations.Reader)
	operator := newRole(t, db, migrations.Operator)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	ws, err := eventstore.New(writer.Pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	first := eventstore.EventData{Type: "x", Data: map[string]int{"n": 0}}
	first.ID = [16]byte{1}
	if _, err := ws.Append(ctx, "s", eventstore.NoStream, first); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 10; i++ {
		if _, err := ws.Append(ctx, "s", eventstore.Any, eventstore.EventData{Type: "x", Data: map[string]int{"n": i}}); err != nil {
			t.Fatal(err)
		}
	}
	var pgErr *pgconn.PgError
	for _, r := range []*role{writer, reader} {
		a, err := archive.New(r.Pool, &archive.Config{Schema: db.Schema, Pause: -1, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.RunOnce(ctx, 5); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Fatalf("%s archives: %v, want permission denied", r.Name, err)
		}
		if _, err := r.Pool.Exec(ctx, `INSERT INTO `+db.Schema+`.events_archive SELECT * FROM `+db.Schema+`.events`); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Fatalf("%s inserts into events_archive: %v, want permission denied", r.Name, err)
		}
	}

	o, err := archive.New(operator.Pool, &archive.Config{Schema: db.Schema, Pause: -1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	p, err := o.RunOnce(ctx, 6)
	if err != nil || !p.Done || p.Moved != 5 || p.StartedBy != operator.Name {
		t.Fatalf("operator archives: %+v %v, want 5 moved, started by %s", p, err, operator.Name)
	}
	if st, err := o.Status(ctx, 1); err != nil || st.Horizon != 6 || len(st.Runs) != 1 {
		t.Fatalf("operator's status: %+v %v", st, err)
	}
	if _, err := operator.Pool.Exec(ctx, `DELETE FROM `+db.Schema+`.events_archive`); err == nil {
		t.Fatal("an operator deleted archived events directly")
	}

	rs, err := eventstore.New(reader.Pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for e, err := range rs.ReadStream(ctx, "s", 1) {
		if err != nil {
			t.Fatal(err)
		}
		n++
		if e.StreamVersion != int64(n) {
			t.Fatalf("reader reads version %d as event %d", e.StreamVersion, n)
		}
	}
	if n != 10 {
		t.Fatalf("reader reads %d events of s, want 10", n)
	}
	res, err := ws.Append(ctx, "s", eventstore.Any, first)
	if err != nil || res.Events[0].GlobalSequence != 1 {
		t.Fatalf("writer re-appends an archived event: %+v %v, want position 1", res, err)
	}
}
