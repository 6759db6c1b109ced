package migrations_test

import (
	"context"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
)

type memberJoined struct {
	MemberID string `json:"member_id"`
	Name     string `json:"name" annals:"personal"`
}

// A writer appends personal data (creating keys) and forgets subjects
// through forget_subject only: it cannot update or delete keys itself, nor
// insert a row with a created_at or forgotten_at of its choosing. A
// reader reads (forgotten subjects redacted) but can neither create keys
// nor forget.
func TestPersonalKeyRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	writer := newRole(t, db, migrations.Writer)
	reader := newRole(t, db, migrations.Reader)
	kek, err := eventstore.NewLocalKEK(make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	store := func(r *role) *eventstore.Store {
		reg := eventstore.NewRegistry()
		eventstore.MustRegister[memberJoined](reg, "member.joined", eventstore.PersonalData("MemberID"))
		s, err := eventstore.New(r.Pool, &eventstore.Config{Schema: db.Schema, Registry: reg, KEK: kek})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ws, rs := store(writer), store(reader)
	for _, id := range []string{"m-1", "m-2"} {
		if _, err := ws.Append(ctx, "member-"+id, eventstore.NoStream, eventstore.NewEvent(memberJoined{MemberID: id, Name: "Ada"})); err != nil {
			t.Fatalf("writer appends personal data: %v", err)
		}
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO `+db.Schema+`.snapshots (aggregate_type, stream_id, schema_version, stream_version, state) VALUES ('member', 'member-m-1', 1, 1, '{"name":"Ada"}')`); err != nil {
		t.Fatal(err)
	}
	var pgErr *pgconn.PgError
	for _, stmt := range []string{
		`UPDATE ` + db.Schema + `.personal_keys SET wrapped_key = NULL, forgotten_at = now()`,
		`DELETE FROM ` + db.Schema + `.personal_keys`,
		// A tombstone forget_subject never wrote, backdated: INSERT covers
		// subject and wrapped_key only.
		`INSERT INTO ` + db.Schema + `.personal_keys (subject, wrapped_key, created_at, forgotten_at) VALUES ('m-9', NULL, '2019-01-01', '2019-01-02')`,
		`INSERT INTO ` + db.Schema + `.personal_keys (subject, wrapped_key, forgotten_at) VALUES ('m-9', NULL, now())`,
	} {
		if _, err := writer.Pool.Exec(ctx, stmt); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Fatalf("writer runs %s: %v, want permission denied", stmt, err)
		}
	}
	if _, err := rs.Append(ctx, "member-m-3", eventstore.NoStream, eventstore.NewEvent(memberJoined{MemberID: "m-3", Name: "Cy"})); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Fatalf("reader creates a key: %v, want permission denied", err)
	}
	if _, err := rs.Forget(ctx, "m-1"); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Fatalf("reader forgets: %v, want permission denied", err)
	}
	res, err := ws.Forget(ctx, "m-1")
	if err != nil || !res.HadKey || res.SnapshotsDeleted != 1 {
		t.Fatalf("writer forgets: %+v %v", res, err)
	}
	for e, err := range rs.ReadAll(ctx, 0) {
		if err != nil {
			t.Fatalf("reader reads: %v", err)
		}
		v, err := eventstore.Decode[memberJoined](rs.Registry(), e)
		want := "Ada"
		if v.Data.MemberID == "m-1" {
			want = eventstore.Forgotten
		}
		if err != nil || v.Data.Name != want {
			t.Fatalf("reader decodes %+v %v, want name %q", v.Data, err, want)
		}
	}
}
