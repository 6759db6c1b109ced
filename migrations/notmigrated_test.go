package migrations_test

import (
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
)

func TestNotMigrated(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := annalstest.NewDB(t, nil)
	store, err := eventstore.New(db.Pool, &eventstore.Config{Schema: "never_migrated"})
	if err != nil {
		t.Fatal(err)
	}
	// The append calls a function of the schema (3F000), the read selects
	// from one of its tables (42P01).
	_, appendErr := store.Append(ctx, "s", eventstore.Any, eventstore.EventData{Type: "t", Data: map[string]any{}})
	var readErr error
	for _, err := range store.ReadAll(ctx, 0) {
		readErr = err
		break
	}
	for name, err := range map[string]error{"append": appendErr, "read": readErr} {
		if !migrations.IsNotMigrated(err) || !errors.Is(migrations.MarkNotMigrated(err), migrations.ErrNotMigrated) {
			t.Errorf("%s on a schema never migrated: %v is not ErrNotMigrated", name, err)
		}
	}

	_, err = db.Pool.Exec(ctx, "SELECT 1/0")
	for _, err := range []error{nil, err, errors.New("other")} {
		if migrations.IsNotMigrated(err) || errors.Is(migrations.MarkNotMigrated(err), migrations.ErrNotMigrated) {
			t.Errorf("%v is ErrNotMigrated", err)
		}
	}
	if migrations.MarkNotMigrated(nil) != nil {
		t.Error("MarkNotMigrated(nil) is not nil")
	}

	if _, err := migrations.Up(ctx, db.Pool, &migrations.Config{Schema: "never_migrated"}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Append(ctx, "s", eventstore.Any, eventstore.EventData{Type: "t", Data: map[string]any{}}); err != nil {
		t.Fatalf("append after migrate: %v", err)
	}
}
