package annals_test

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/archive"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/scavenge"
)

// PatientAdmitted carries personal data of PatientID.
type PatientAdmitted struct {
	PatientID string `json:"patient_id"`
	Name      string `json:"name" annals:"personal"`
	Email     string `json:"email" annals:"personal"`
	Ward      string `json:"ward"`
}

// Patient is an aggregate whose state (and so its snapshots) holds
// personal data.
type Patient struct {
	aggregate.Base
	Name, Email, Ward string
	Admissions        int
}

func (p *Patient) Apply(event any) error {
	e, ok := event.(PatientAdmitted)
	if !ok {
		return aggregate.ErrUnhandledEvent
	}
	p.Name, p.Email, p.Ward = e.Name, e.Email, e.Ward
	p.Admissions++
	return nil
}

// TestForgetEndToEnd: a subject's personal data goes through an aggregate
// with snapshots, a projection's read model, and a dead letter; after
// Forget, aggregate loads, reads and a projection rebuild see the redacted
// values, and no byte of the plaintext is left in any table annals stores
// data in (events, events_archive, snapshots, saga_states, dead_letters,
// failures, personal_keys), also when most of the log is archived. The read model is the application's: the rebuild
// rewrites it redacted.
func TestForgetEndToEnd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db := annalstest.NewDB(t, nil)
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	kek, err := eventstore.NewLocalKEK(key)
	if err != nil {
		t.Fatal(err)
	}
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[PatientAdmitted](reg, "patient.admitted", eventstore.PersonalData("PatientID"))
	store, err := eventstore.New(db.Pool, &eventstore.Config{Registry: reg, KEK: kek})
	if err != nil {
		t.Fatal(err)
	}
	repo, err := aggregate.NewRepository(store, "patient", func() *Patient { return &Patient{} },
		&aggregate.Config{Snapshots: &aggregate.SnapshotConfig{Every: 1}})
	if err != nil {
		t.Fatal(err)
	}
	const (
		name  = "Grace Brewster Hopper"
		email = "grace.hopper@navy.example"
	)
	for _, id := range []string{"p-1", "p-2"} {
		for _, ward := range []string{"A", "B"} {
			n, e := name, email
			if id == "p-2" {
				n, e = "Other Person", "other@example.org"
			}
			if _, err := repo.Update(ctx, id, func(p *Patient) error {
				return aggregate.Record(p, PatientAdmitted{PatientID: id, Name: n, Email: e, Ward: ward})
			}); err != nil && !errors.Is(err, aggregate.ErrNotFound) {
				t.Fatal(err)
			} else if err != nil {
				if _, err := repo.Create(ctx, id, func(p *Patient) error {
					return aggregate.Record(p, PatientAdmitted{PatientID: id, Name: n, Email: e, Ward: ward})
				}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}

	if _, err := db.Pool.Exec(ctx, `CREATE TABLE patients (id text PRIMARY KEY, name text, email text, ward text)`); err != nil {
		t.Fatal(err)
	}
	p := projection.New("patients", reg)
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[PatientAdmitted]) error {
		_, err := tx.Exec(ctx, `INSERT INTO patients VALUES ($1, $2, $3, $4)
			ON CONFLICT (id) DO UPDATE SET name = $2, email = $3, ward = $4`, e.Data.PatientID, e.Data.Name, e.Data.Email, e.Data.Ward)
		return err
	})
	p.OnReset(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `TRUNCATE patients`)
		return err
	})
	// A projection that refuses the events of ward B: dead letters and
	// failure rows referring to events with personal data.
	strict := projection.New("strict", reg)
	projection.On(strict, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[PatientAdmitted]) error {
		if e.Data.Ward == "B" {
			return annals.Permanent(errors.Newf("ward B refused for event %s", e.ID))
		}
		return nil
	})
	runner, err := projection.NewRunner(db.Pool, &projection.Config{Registry: reg, LockRetryInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := runner.Register(p, nil); err != nil {
		t.Fatal(err)
	}
	if err := runner.Register(strict, &projection.Options{OnDeadLetter: projection.SkipEvent}); err != nil {
		t.Fatal(err)
	}
	if err := runner.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	readModel := func(id string) (n, e string) {
		t.Helper()
		if err := db.Pool.QueryRow(ctx, `SELECT name, email FROM patients WHERE id = $1`, id).Scan(&n, &e); err != nil {
			t.Fatal(err)
		}
		return n, e
	}
	if n, e := readModel("p-1"); n != name || e != email {
		t.Fatalf("read model before Forget: %q %q", n, e)
	}
	leftIn := func(plain string) map[string]int {
		t.Helper()
		out := map[string]int{}
		for _, table := range []string{"events", "events_archive", "snapshots", "saga_states", "dead_letters", "failures", "personal_keys"} {
			var n int
			if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.`+table+` t WHERE t::text LIKE '%' || $1 || '%'`, plain).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				out[table] = n
			}
		}
		return out
	}
	// Before Forget the snapshots hold the aggregate's state in clear (so
	// the search can find what it looks for), the events do not.
	if left := leftIn(name); left["snapshots"] == 0 || left["events"] != 0 {
		t.Fatalf("before Forget %q is in %v; want it in snapshots only", name, left)
	}
	var deadLetters int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.dead_letters WHERE subscriber_id = 'strict'`).Scan(&deadLetters); err != nil || deadLetters == 0 {
		t.Fatalf("%d dead letters of strict (%v), want some", deadLetters, err)
	}
	head, err := store.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// Most of the log is archived first: Forget must reach archived events
	// (their personal fields stay encrypted there) and the rebuild below
	// reads them from the archive.
	arch, err := archive.New(db.Pool, &archive.Config{Pause: -1})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := arch.RunOnce(ctx, head); err != nil || p.Moved == 0 {
		t.Fatalf("archive: %+v %v", p, err)
	}
	var archived int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.events_archive WHERE stream_id = 'patient-p-1' OR data::text LIKE '%p-1%'`).Scan(&archived); err != nil || archived == 0 {
		t.Fatalf("%d archived events of p-1 (%v)", archived, err)
	}

	res, err := store.Forget(ctx, "p-1")
	if err != nil || !res.HadKey || res.SnapshotsDeleted != 1 {
		t.Fatalf("Forget: %+v %v; want the key and 1 snapshot gone", res, err)
	}
	for _, plain := range []string{name, email, "Grace", "grace.hopper"} {
		if left := leftIn(plain); len(left) != 0 {
			t.Errorf("after Forget %q is still in %v", plain, left)
		}
	}
	if h, err := store.Head(ctx); err != nil || h != head {
		t.Fatalf("head %d after Forget, want %d (%v)", h, head, err)
	}
	// Aggregate load (no snapshot left: a replay of redacted events).
	got, err := repo.Load(ctx, "p-1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != eventstore.Forgotten || got.Email != eventstore.Forgotten || got.Ward != "B" || got.Admissions != 2 || got.Version() != 2 {
		t.Fatalf("aggregate after Forget: %+v", got)
	}
	if other, err := repo.Load(ctx, "p-2"); err != nil || other.Name != "Other Person" {
		t.Fatalf("the other patient: %+v %v", other, err)
	}
	// Rebuild: the read model is written again from the redacted events.
	if err := runner.Rebuild(ctx, "patients", nil); err != nil {
		t.Fatal(err)
	}
	if n, e := readModel("p-1"); n != eventstore.Forgotten || e != eventstore.Forgotten {
		t.Fatalf("read model after rebuild: %q %q", n, e)
	}
	if n, _ := readModel("p-2"); n != "Other Person" {
		t.Fatalf("the other patient's read model: %q", n)
	}
	var inModel int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM patients t WHERE t::text LIKE '%' || $1 || '%'`, name).Scan(&inModel); err != nil || inModel != 0 {
		t.Fatalf("the rebuilt read model holds the name %d times (%v)", inModel, err)
	}
	// The next Save writes a snapshot again: of the redacted state.
	if _, err := repo.Update(ctx, "p-2", func(p *Patient) error {
		return aggregate.Record(p, PatientAdmitted{PatientID: "p-2", Name: "Other Person", Email: "other@example.org", Ward: "C"})
	}); err != nil {
		t.Fatal(err)
	}
	if left := leftIn(name); len(left) != 0 {
		t.Fatalf("after another save %q is in %v", name, left)
	}
}

// TestForgetAfterScavenge: Forget reaches an aggregate's snapshot after
// the subject's events were scavenged, by retention or by a hard delete.
// It used to find snapshots only through the events, so the snapshot kept
// the subject's personal data in clear.
func TestForgetAfterScavenge(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := annalstest.NewDB(t, nil)
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	kek, err := eventstore.NewLocalKEK(key)
	if err != nil {
		t.Fatal(err)
	}
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[PatientAdmitted](reg, "patient.admitted", eventstore.PersonalData("PatientID"))
	store, err := eventstore.New(db.Pool, &eventstore.Config{Registry: reg, KEK: kek})
	if err != nil {
		t.Fatal(err)
	}
	repo, err := aggregate.NewRepository(store, "patient", func() *Patient { return &Patient{} },
		&aggregate.Config{Snapshots: &aggregate.SnapshotConfig{Every: 1}})
	if err != nil {
		t.Fatal(err)
	}
	// p-kept is truncated before its second version (its only event, with
	// the name, goes; the stream stays); p-gone is hard-deleted.
	admit := func(id, subject, name string) {
		t.Helper()
		if _, err := repo.Update(ctx, id, func(p *Patient) error {
			return aggregate.Record(p, PatientAdmitted{PatientID: subject, Name: name, Ward: "A"})
		}); errors.Is(err, aggregate.ErrNotFound) {
			_, err = repo.Create(ctx, id, func(p *Patient) error {
				return aggregate.Record(p, PatientAdmitted{PatientID: subject, Name: name, Ward: "A"})
			})
			if err != nil {
				t.Fatal(err)
			}
		} else if err != nil {
			t.Fatal(err)
		}
	}
	admit("p-kept", "s-1", "Ada Secretname")
	admit("p-gone", "s-2", "Zelda Secretname")
	two := int64(2)
	if _, err := store.SetStreamRetention(ctx, "patient-p-kept", eventstore.RetentionChange{TruncateBefore: &two}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.DeleteStream(ctx, "patient-p-gone", eventstore.Any, &eventstore.DeleteOptions{Hard: true}); err != nil {
		t.Fatal(err)
	}
	sc, err := scavenge.New(db.Pool, &scavenge.Config{Pause: -1})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := sc.RunOnce(ctx); err != nil || p.Removed < 2 {
		t.Fatalf("scavenge: %+v %v; want the first event of p-kept and p-gone's removed", p, err)
	}
	var left int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.events_all WHERE data::text LIKE '%"s-1"%' OR data::text LIKE '%"s-2"%'`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d events of s-1 or s-2 left after the scavenge (%v)", left, err)
	}
	// The scavenger deleted the snapshots built from the events it removed
	// (migration 0027). One saved by a load that raced with it (read
	// before the removal) can remain: Forget still finds it through
	// personal_streams. p-gone's is put back as such a save would.
	var snaps int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.snapshots`).Scan(&snaps); err != nil || snaps != 0 {
		t.Fatalf("%d snapshots left after the scavenge (%v); want those of the removed events deleted", snaps, err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO annals.snapshots (aggregate_type, stream_id, schema_version, stream_version, state)
		VALUES ('patient', 'patient-p-gone', 1, 1, '{"Name": "Zelda Secretname"}')`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		subject, plain string
		snapshots      int64
	}{{"s-1", "Ada Secretname", 0}, {"s-2", "Zelda Secretname", 1}} {
		res, err := store.Forget(ctx, c.subject)
		if err != nil || res.SnapshotsDeleted != c.snapshots {
			t.Fatalf("Forget(%s): %+v %v; want %d snapshots deleted", c.subject, res, err, c.snapshots)
		}
		var after int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.snapshots s WHERE s::text LIKE '%' || $1 || '%'`, c.plain).Scan(&after); err != nil || after != 0 {
			t.Fatalf("%q in %d snapshots after Forget (%v)", c.plain, after, err)
		}
	}
	var links int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.personal_streams WHERE subject IN ('s-1', 's-2')`).Scan(&links); err != nil || links != 0 {
		t.Fatalf("%d links of the forgotten subjects kept (%v)", links, err)
	}
}
