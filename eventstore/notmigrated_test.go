package eventstore_test

import (
	stderrors "errors"
	"strings"
	"testing"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
)

// An append to a schema that was never migrated fails with an error that
// matches migrations.ErrNotMigrated and says how to migrate; it was a bare
// `schema "nomigr" does not exist (SQLSTATE 3F000)`.
func TestAppendToAnUnmigratedSchema(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	s, err := eventstore.New(db.Pool, &eventstore.Config{Schema: "nomigr"})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 2} { // append_one, append_batch
		events := make([]eventstore.EventData, n)
		for i := range events {
			events[i] = eventstore.EventData{Type: "t", Data: map[string]int{}}
		}
		_, err := s.Append(t.Context(), "s", eventstore.Any, events...)
		if !stderrors.Is(err, migrations.ErrNotMigrated) || !strings.Contains(err.Error(), "not migrated") {
			t.Errorf("append of %d to an unmigrated schema: %v, want ErrNotMigrated", n, err)
		}
	}
}
