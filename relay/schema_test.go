package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/relay"
)

// A relay on a schema that is not migrated (or does not exist) fails first
// with migrations.ErrNotMigrated, saying to migrate, and makes no stream:
// before, it made the stream, then failed with a raw "checkpoint: load
// relay/0: relation "nope.checkpoints" does not exist", and on a stream
// another relay had made it was refused as another log's stream and told to
// adopt it, on a schema that does not exist.
func TestRelayOnASchemaNotMigrated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, migrations.ErrNotMigrated) || !strings.Contains(err.Error(), "annals migrate --schema nope") ||
			strings.Contains(err.Error(), "adopt") {
			t.Fatalf("%s on schema nope: %v; want migrations.ErrNotMigrated, saying to run annals migrate --schema nope", what, err)
		}
	}
	nope, err := relay.New(b.db.Pool, b.nc, &relay.Config{Schema: "nope", RetryBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_, err = nope.EnsureStream(ctx)
	check("EnsureStream without a stream", err)
	if _, err := b.js.Stream(ctx, "ANNALS"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("the stream after the refused EnsureStream: %v; want none made", err)
	}
	check("CatchUp without a stream", nope.CatchUp(ctx))
	check("Run without a stream", nope.Run(ctx))

	// The stream of the relay of the migrated schema.
	appendMany(t, b.store, 2)
	r, err := relay.New(b.db.Pool, b.nc, &relay.Config{RetryBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = nope.EnsureStream(ctx)
	check("EnsureStream on another log's stream", err)
	check("CatchUp on another log's stream", nope.CatchUp(ctx))
}

// A second relay with a stream of its own but the default subject prefix
// is refused by JetStream (subjects overlap, 10065); the error says to give
// it a prefix (or subject template) of its own. Before, it was NATS's raw
// "subjects overlap with an existing stream".
func TestSecondRelayWithOverlappingSubjects(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	first, err := relay.New(b.db.Pool, b.nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.EnsureStream(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := relay.New(b.db.Pool, b.nc, &relay.Config{Name: "second", Stream: "S3"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = second.EnsureStream(ctx)
	var jsErr jetstream.JetStreamError
	if !errors.As(err, &jsErr) || jsErr.APIError() == nil || jsErr.APIError().ErrorCode != 10065 {
		t.Fatalf("EnsureStream of a second relay on the default subjects: %v; want JetStream's subjects-overlap error (10065)", err)
	}
	for _, s := range []string{"S3", "annals.*.*", "overlap", "Config.Prefix", "--prefix"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("the error does not say %q: %v", s, err)
		}
	}
	// With a prefix of its own it is taken.
	third, err := relay.New(b.db.Pool, b.nc, &relay.Config{Name: "third", Stream: "S3", Prefix: "third"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := third.EnsureStream(ctx); err != nil {
		t.Fatal(err)
	}
}
