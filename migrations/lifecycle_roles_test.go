package migrations_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/scavenge"
)

// A writer deletes streams and sets retention through annals' functions;
// only an operator scavenges, and the run records the operator's role.
func TestLifecycleRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	writer := newRole(t, db, migrations.Writer)
	operator := newRole(t, db, migrations.Operator)

	ws, err := eventstore.New(writer.Pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"a", "b"} {
		if _, err := ws.Append(ctx, s, eventstore.NoStream, eventstore.EventData{Type: "x", Data: map[string]int{"n": 1}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ws.DeleteStream(ctx, "a", eventstore.Any, &eventstore.DeleteOptions{Hard: true}); err != nil {
		t.Fatalf("writer deletes a stream: %v", err)
	}
	two := int64(2)
	if _, err := ws.SetStreamRetention(ctx, "b", eventstore.RetentionChange{TruncateBefore: &two}); err != nil {
		t.Fatalf("writer sets retention: %v", err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	w, err := scavenge.New(writer.Pool, &scavenge.Config{Schema: db.Schema, Pause: -1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	var pgErr *pgconn.PgError
	if _, err := w.RunOnce(ctx); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Fatalf("writer scavenges: %v, want permission denied", err)
	}
	if _, err := writer.Pool.Exec(ctx, `DELETE FROM `+db.Schema+`.events`); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Fatalf("writer deletes events: %v, want permission denied", err)
	}

	o, err := scavenge.New(operator.Pool, &scavenge.Config{Schema: db.Schema, Pause: -1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	p, err := o.RunOnce(ctx)
	if err != nil || !p.Done || p.Removed != 3 || p.StartedBy != operator.Name {
		t.Fatalf("operator scavenges: %+v %v, want 3 removed, started by %s", p, err, operator.Name)
	}
	if _, err := operator.Pool.Exec(ctx, `DELETE FROM `+db.Schema+`.events`); err == nil {
		t.Fatal("an operator deleted events directly")
	}
}
