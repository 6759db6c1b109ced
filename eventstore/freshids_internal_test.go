package eventstore

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/internal/freshids"
)

// IDs a caller chose are looked up by the append (callerIDs), unless the
// context marks them fresh (package aggregate's first attempt of a Save:
// UUIDv7 made for it, which no stored event can have); generated IDs never
// are.
func TestFreshIDsAreNotLookedUp(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none") // never connects
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	ev := func(id uuid.UUID) EventData {
		return EventData{ID: id, Type: "t", Data: map[string]int{"n": 1}}
	}
	for _, c := range []struct {
		name   string
		ctx    context.Context
		id     uuid.UUID
		lookUp bool
	}{
		{"CallerID", context.Background(), uuid.New(), true},
		{"FreshID", freshids.With(context.Background()), uuid.New(), false},
		{"GeneratedID", context.Background(), uuid.Nil, false},
	} {
		a, err := s.encode(c.ctx, "s", Any, []EventData{ev(c.id)})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if a.callerIDs != c.lookUp || (c.id != uuid.Nil && a.events[0].id != c.id) {
			t.Errorf("%s: callerIDs %v (want %v), ID %s (given %s)", c.name, a.callerIDs, c.lookUp, a.events[0].id, c.id)
		}
	}
}
