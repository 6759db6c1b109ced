package eventstore_test

import (
	"context"
	"encoding/json"
	stderrors "errors"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// MemberJoined is at schema version 3. Its history:
//
//	v1 {"name": "Ada"}
//	v2 {"full_name": "Ada"}                    (renamed)
//	v3 {"full_name": "Ada", "tier": "basic"}   (new field with a default)
type MemberJoined struct {
	FullName string `json:"full_name"`
	Tier     string `json:"tier"`
}

func rename(data json.RawMessage) (json.RawMessage, error) {
	var v1 struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(data, &v1); err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{"full_name": v1.Name})
}

func addTier(data json.RawMessage) (json.RawMessage, error) {
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	if _, ok := m["tier"]; !ok {
		m["tier"] = "basic"
	}
	return json.Marshal(m)
}

func memberRegistry(t *testing.T) *eventstore.Registry {
	t.Helper()
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[MemberJoined](reg, "member.joined")
	if err := reg.RegisterUpcaster("member.joined", 1, rename); err != nil {
		t.Fatal(err)
	}
	if err := reg.RegisterUpcaster("member.joined", 2, addTier); err != nil {
		t.Fatal(err)
	}
	return reg
}

func TestUpcasting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setupUp := func(t *testing.T) (*annalstest.DB, *eventstore.Store, *eventstore.Registry) {
		db := annalstest.NewDB(t, nil)
		reg := memberRegistry(t)
		store, err := eventstore.New(db.Pool, &eventstore.Config{Registry: reg})
		if err != nil {
			t.Fatal(err)
		}
		return db, store, reg
	}

	t.Run("OldEventsReadAtCurrentVersion", func(t *testing.T) {
		t.Parallel()
		db, store, reg := setupUp(t)
		// An old producer (no upcasters, so no stamp) wrote v1; another stored v2 explicitly.
		old, err := eventstore.New(db.Pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := old.Append(ctx, "member-1", eventstore.NoStream, eventstore.EventData{Type: "member.joined", Data: []byte(`{"name":"Ada"}`)}); err != nil {
			t.Fatal(err)
		}
		v2 := eventstore.Metadata{Extra: map[string]any{eventstore.SchemaVersionKey: 2}}
		if _, err := store.Append(ctx, "member-2", eventstore.NoStream, eventstore.EventData{Type: "member.joined", Data: []byte(`{"full_name":"Bob","tier":"gold"}`), Metadata: v2}); err != nil {
			t.Fatal(err)
		}
		// The current producer writes v3 and stamps it.
		if _, err := store.Append(ctx, "member-3", eventstore.NoStream, eventstore.NewEvent(MemberJoined{FullName: "Cy", Tier: "silver"})); err != nil {
			t.Fatal(err)
		}
		want := []MemberJoined{{"Ada", "basic"}, {"Bob", "gold"}, {"Cy", "silver"}}

		events, err := collect(t, store.ReadAll(ctx, 0))
		if err != nil || len(events) != 3 {
			t.Fatalf("ReadAll: %d events, %v", len(events), err)
		}
		for i, e := range events {
			if v, err := e.Metadata.SchemaVersion(); v != 3 || err != nil {
				t.Errorf("event %d: read at schema version %d (%v), want 3", i, v, err)
			}
			env, err := eventstore.Decode[MemberJoined](reg, e)
			if err != nil || env.Data != want[i] {
				t.Errorf("event %d: Decode[T] = %+v (%v), want %+v", i, env.Data, err, want[i])
			}
		}
		one, err := collect(t, store.ReadStream(ctx, "member-1", 1))
		if err != nil || len(one) != 1 {
			t.Fatal(err)
		}
		var got MemberJoined
		if err := json.Unmarshal(one[0].Data, &got); err != nil || got != want[0] {
			t.Fatalf("ReadStream data %s, want the v3 shape of %+v", one[0].Data, want[0])
		}

		// Events obtained without the store (a raw row, say) upcast in Decode.
		raw := eventstore.Event{Type: "member.joined", Data: json.RawMessage(`{"name":"Dee"}`)}
		if v, err := reg.Decode(raw); err != nil || v != (MemberJoined{"Dee", "basic"}) {
			t.Fatalf("Decode of a raw v1 event: %+v, %v", v, err)
		}
		if env, err := eventstore.Decode[MemberJoined](reg, raw); err != nil || env.Data != (MemberJoined{"Dee", "basic"}) {
			t.Fatalf("Decode[T] of a raw v1 event: %+v, %v", env.Data, err)
		}

		// Nothing stored was rewritten; the stored versions are as appended.
		rows, err := db.Pool.Query(ctx, `SELECT data::jsonb::text, coalesce(metadata->>'schema_version', '') FROM annals.events ORDER BY global_sequence`)
		if err != nil {
			t.Fatal(err)
		}
		var stored []string
		for rows.Next() {
			var d, v string
			if err := rows.Scan(&d, &v); err != nil {
				t.Fatal(err)
			}
			stored = append(stored, d+" v"+v)
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		wantStored := []string{`{"name": "Ada"} v`, `{"tier": "gold", "full_name": "Bob"} v2`, `{"tier": "silver", "full_name": "Cy"} v3`}
		if strings.Join(stored, "|") != strings.Join(wantStored, "|") {
			t.Fatalf("stored rows\n%v\nwant\n%v", stored, wantStored)
		}
	})

	t.Run("UpcastFailuresAreErrors", func(t *testing.T) {
		t.Parallel()
		db, _, _ := setupUp(t)
		reg := eventstore.NewRegistry()
		reg.MustRegisterUpcaster("member.joined", 1, func(json.RawMessage) (json.RawMessage, error) {
			return nil, errors.New("boom")
		})
		store, err := eventstore.New(db.Pool, &eventstore.Config{Registry: reg})
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := eventstore.New(db.Pool, nil)
		if _, err := raw.Append(ctx, "member-1", eventstore.NoStream, eventstore.EventData{Type: "member.joined", Data: []byte(`{"name":"Ada"}`)}); err != nil {
			t.Fatal(err)
		}
		_, err = collect(t, store.ReadStream(ctx, "member-1", 1))
		if !stderrors.Is(err, eventstore.ErrUpcast) || !strings.Contains(err.Error(), "boom") || !strings.Contains(err.Error(), "member.joined") {
			t.Fatalf("ReadStream with a failing upcaster: %v, want ErrUpcast naming the event", err)
		}
		// An event newer than the registry knows (written by newer code).
		future := eventstore.Metadata{Extra: map[string]any{eventstore.SchemaVersionKey: 7}}
		if _, err := raw.Append(ctx, "member-2", eventstore.NoStream, eventstore.EventData{Type: "member.joined", Data: []byte(`{}`), Metadata: future}); err != nil {
			t.Fatal(err)
		}
		_, err = collect(t, memberStore(t, db).ReadStream(ctx, "member-2", 1))
		if !errors.Is(err, eventstore.ErrUpcast) || !strings.Contains(err.Error(), "schema version 7") {
			t.Fatalf("reading a v7 event with a v3 registry: %v", err)
		}
	})

	t.Run("AppendValidatesVersions", func(t *testing.T) {
		t.Parallel()
		db, store, _ := setupUp(t)
		// The message names the metadata once (the InvalidEventError's
		// Field), then what is wrong with it.
		for v, want := range map[any]string{
			4:   `invalid event: event 1: metadata: schema_version 4 is newer than 3, the current version of "member.joined"`,
			0:   `invalid event: event 1: metadata: schema_version 0 is not a positive integer`,
			"2": `invalid event: event 1: metadata: schema_version 2 (string) is not a positive integer`,
			1.5: `invalid event: event 1: metadata: schema_version 1.5 is not a positive integer`,
		} {
			md := eventstore.Metadata{Extra: map[string]any{eventstore.SchemaVersionKey: v}}
			_, err := store.Append(ctx, "member-1", eventstore.Any, eventstore.EventData{Type: "member.joined", Data: []byte(`{}`), Metadata: md})
			if !errors.Is(err, eventstore.ErrInvalidEvent) {
				t.Errorf("append with schema_version %v: %v, want ErrInvalidEvent", v, err)
			}
			if err == nil || err.Error() != want {
				t.Errorf("append with schema_version %v: %v, want %q", v, err, want)
			}
		}
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.events`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d events stored (%v)", n, err)
		}
	})
}

func memberStore(t *testing.T, db *annalstest.DB) *eventstore.Store {
	t.Helper()
	s, err := eventstore.New(db.Pool, &eventstore.Config{Registry: memberRegistry(t)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestUpcasterRegistration(t *testing.T) {
	t.Parallel()
	noop := func(d json.RawMessage) (json.RawMessage, error) { return d, nil }
	reg := eventstore.NewRegistry()
	if v := reg.SchemaVersion("a"); v != 1 {
		t.Fatalf("version without upcasters: %d", v)
	}
	reg.MustRegisterUpcaster("a", 1, noop)
	cases := []struct {
		name, typ string
		from      int
		fn        eventstore.Upcaster
		want      string
	}{
		{"Duplicate", "a", 1, noop, "already registered"},
		{"Gap", "a", 3, noop, "leaves a gap"},
		{"GapFromStart", "b", 2, noop, "leaves a gap"},
		{"ZeroVersion", "a", 0, noop, "versions start at 1"},
		{"EmptyType", "", 1, noop, "empty"},
		{"NilFunc", "a", 2, nil, "nil"},
	}
	for _, c := range cases {
		err := reg.RegisterUpcaster(c.typ, c.from, c.fn)
		if !errors.Is(err, eventstore.ErrInvalidUpcaster) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalidUpcaster (%s)", c.name, err, c.want)
		}
	}
	if v := reg.SchemaVersion("a"); v != 2 {
		t.Fatalf("rejected registrations changed the chain: version %d, want 2", v)
	}
	if v := reg.SchemaVersion("b"); v != 1 {
		t.Fatalf("a rejected registration created a chain for b: version %d", v)
	}
	reg.MustRegisterUpcaster("a", 2, noop)
	if v := reg.SchemaVersion("a"); v != 3 {
		t.Fatalf("version after 1→2→3: %d", v)
	}
}

// BenchmarkUpcast is the cost Registry.Upcast adds to each read event: a
// type without upcasters, an event already at the current version, and a v1
// event taken through two JSON upcasters.
//
//	go test -run '^$' -bench BenchmarkUpcast ./eventstore/
func BenchmarkUpcast(b *testing.B) {
	reg := eventstore.NewRegistry()
	reg.MustRegisterUpcaster("member.joined", 1, rename)
	reg.MustRegisterUpcaster("member.joined", 2, addTier)
	current := eventstore.Metadata{Extra: map[string]any{eventstore.SchemaVersionKey: float64(3)}}
	for _, c := range []struct {
		name string
		e    eventstore.Event
	}{
		{"NoUpcasters", eventstore.Event{Type: "order.placed", Data: []byte(`{"total":1}`)}},
		{"Current", eventstore.Event{Type: "member.joined", Data: []byte(`{"full_name":"Ada","tier":"gold"}`), Metadata: current}},
		{"V1ToV3", eventstore.Event{Type: "member.joined", Data: []byte(`{"name":"Ada"}`)}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := reg.Upcast(c.e); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
