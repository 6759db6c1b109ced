package aggregate_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// Renamed is at schema version 3: v1 {"name"} → v2 {"new_name"} → v3
// {"first", "last"}.
type Renamed struct {
	First string `json:"first"`
	Last  string `json:"last"`
}

type Member struct {
	aggregate.Base
	First, Last string
}

func (m *Member) Apply(event any) error {
	switch e := event.(type) {
	case Renamed:
		m.First, m.Last = e.First, e.Last
	default:
		return aggregate.ErrUnhandledEvent
	}
	return nil
}

func TestAggregateSeesUpcastEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[Renamed](reg, "member.renamed")
	reg.MustRegisterUpcaster("member.renamed", 1, func(d json.RawMessage) (json.RawMessage, error) {
		var v1 struct{ Name string }
		if err := json.Unmarshal(d, &v1); err != nil {
			return nil, err
		}
		return json.Marshal(map[string]string{"new_name": v1.Name})
	})
	reg.MustRegisterUpcaster("member.renamed", 2, func(d json.RawMessage) (json.RawMessage, error) {
		var v2 struct {
			NewName string `json:"new_name"`
		}
		if err := json.Unmarshal(d, &v2); err != nil {
			return nil, err
		}
		first, last, _ := strings.Cut(v2.NewName, " ")
		return json.Marshal(Renamed{First: first, Last: last})
	})
	store, err := eventstore.New(db.Pool, &eventstore.Config{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	// Stored by an old producer: v1 shape, no schema_version.
	old, _ := eventstore.New(db.Pool, nil)
	if _, err := old.Append(ctx, "member-1", eventstore.NoStream, eventstore.EventData{Type: "member.renamed", Data: []byte(`{"name":"Ada Lovelace"}`)}); err != nil {
		t.Fatal(err)
	}
	r, err := aggregate.NewRepository(store, "member", func() *Member { return &Member{} }, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := r.Load(ctx, "1")
	if err != nil {
		t.Fatal(err)
	}
	if m.First != "Ada" || m.Last != "Lovelace" {
		t.Fatalf("loaded %+v, want the v1 event upcast to Ada/Lovelace", *m)
	}
	// New events are written at v3 and read back as such.
	if _, err := r.Update(ctx, "1", func(m *Member) error { return aggregate.Record(m, Renamed{First: "Ada", Last: "King"}) }); err != nil {
		t.Fatal(err)
	}
	if m, err := r.Load(ctx, "1"); err != nil || m.Last != "King" || m.Version() != 2 {
		t.Fatalf("after update: %+v %v", m, err)
	}
	var v string
	if err := db.Pool.QueryRow(ctx, `SELECT metadata->>'schema_version' FROM annals.events WHERE stream_version = 2`).Scan(&v); err != nil || v != "3" {
		t.Fatalf("the new event was stored at schema version %q (%v), want 3", v, err)
	}
}
