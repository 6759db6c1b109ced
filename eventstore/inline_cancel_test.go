package eventstore_test

import (
	"context"
	stderrors "errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// cancellingInline ends the Append's context in its handler, before the
// append and its COMMIT are sent, and returns the context's error.
type cancellingInline struct{ cancel context.CancelFunc }

func (cancellingInline) Name() string { return "cancelling" }

func (c cancellingInline) Handle(ctx context.Context, _ pgx.Tx, _ eventstore.Event) error {
	c.cancel()
	return ctx.Err()
}

// An Append through an inline projection whose context ends before its
// append and COMMIT are sent wrote nothing, and says so as an Append
// without inline projections does: ErrNotWritten (and the context's
// error), not ErrOutcomeUnknown. It matched neither before.
func TestInlineAppendCancelledBeforeSendingIsNotWritten(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	store, err := eventstore.New(db.Pool, &eventstore.Config{Inline: []eventstore.InlineProjection{cancellingInline{cancel}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = store.Append(ctx, "c-1", eventstore.NoStream, eventstore.EventData{Type: "t.x", Data: map[string]int{"n": 1}})
	if !isBoth(err, eventstore.ErrNotWritten) || !isBoth(err, context.Canceled) || stderrors.Is(err, eventstore.ErrOutcomeUnknown) {
		t.Fatalf("an inline Append cancelled in its handler: %v; want ErrNotWritten and context.Canceled", err)
	}
	if _, err := store.StreamVersion(t.Context(), "c-1"); !stderrors.Is(err, eventstore.ErrStreamNotFound) {
		t.Fatalf("the stream after a cancelled inline Append: %v; want none", err)
	}
}
