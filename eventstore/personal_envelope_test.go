package eventstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// TestForgetFindsEveryEnvelopeAReaderDecrypts: Forget (forget_subject) finds
// the streams holding a subject's personal data by the envelope's exact keys
// ("$personal", then "subject", as jsonb reads them), and deletes their
// snapshots, which hold the data decrypted. A reader must decrypt no
// envelope that this search would miss, or data it decrypted (and an
// aggregate snapshotted) outlives the Forget. encoding/json matches a
// struct's keys case-insensitively (and folds ſ to s, K to k): a writer
// without the KEK could copy a subject's envelope into another stream with
// its "subject" key spelled "Subject" (or its "$personal" key "$Personal"
// after a null "$personal"), a reader with the KEK decrypted it, and Forget
// left that stream's snapshot in place.
func TestForgetFindsEveryEnvelopeAReaderDecrypts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	reg := personalRegistry(t)
	s := personalStore(t, db, newKEK(t), &eventstore.Config{Registry: reg})
	if _, err := s.Append(ctx, "customer-c-1", eventstore.NoStream, eventstore.NewEvent(ada("c-1"))); err != nil {
		t.Fatal(err)
	}
	stored := storedData(t, db, "customer-c-1")
	if !strings.Contains(stored, `"$personal":{"v":1,"subject":"c-1",`) {
		t.Fatalf("stored data is not in the form this test rewrites: %s", stored)
	}
	// The same envelopes (same field names: the AAD binds subject and
	// field), keys respelled.
	crafted := map[string]string{
		"copy-subject-cased":  strings.ReplaceAll(stored, `"subject":"c-1"`, `"Subject":"c-1"`),
		"copy-subject-folded": strings.ReplaceAll(stored, `"subject":"c-1"`, `"ſubject":"c-1"`),
		"copy-subject-twice":  strings.ReplaceAll(stored, `"subject":"c-1"`, `"subject":"c-other","SUBJECT":"c-1"`),
		"copy-marker-cased":   strings.ReplaceAll(stored, `{"$personal":{`, `{"$personal":null,"$Personal":{`),
	}
	streams := []string{"customer-c-1"}
	for stream, data := range crafted {
		if _, err := db.Pool.Exec(ctx, `SELECT * FROM annals.append_one($1, 0, gen_random_uuid(), 'customer.registered', $2, NULL, true)`,
			stream, data); err != nil {
			t.Fatalf("append %s: %v", stream, err)
		}
		streams = append(streams, stream)
	}
	// What an aggregate that loaded each stream would have saved.
	revealed := map[string]bool{}
	for _, stream := range streams {
		got, err := readOne(t, s, reg, stream)
		revealed[stream] = err == nil && got.Name == ada("c-1").Name
		if _, err := db.Pool.Exec(ctx, `INSERT INTO annals.snapshots (aggregate_type, stream_id, schema_version, stream_version, state)
			VALUES ('customer', $1, 1, 1, '{}')`, stream); err != nil {
			t.Fatal(err)
		}
	}
	if !revealed["customer-c-1"] {
		t.Fatal("control: the subject's own event does not read decrypted")
	}
	if _, err := s.Forget(ctx, "c-1"); err != nil {
		t.Fatal(err)
	}
	for _, stream := range streams {
		var left int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.snapshots WHERE stream_id = $1`, stream).Scan(&left); err != nil {
			t.Fatal(err)
		}
		switch {
		case stream == "customer-c-1" && left != 0:
			t.Errorf("control: Forget left the snapshot of %s", stream)
		case revealed[stream] && left != 0:
			t.Errorf("%s: a reader decrypted subject c-1's data from it, and Forget(c-1) left its snapshot", stream)
		}
	}
}
