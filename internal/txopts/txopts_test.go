package txopts

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Take strips what ctx asks of one Transact, the options and
// QuietWhenEmpty, from the context it hands the body: a Transact nested in
// it gets its session's defaults and records its telemetry.
func TestTakeStripsTheAsks(t *testing.T) {
	t.Parallel()
	ctx := QuietWhenEmpty(With(context.Background(), pgx.TxOptions{IsoLevel: pgx.ReadCommitted}))
	if !IsQuietWhenEmpty(ctx) || From(ctx).IsoLevel != pgx.ReadCommitted {
		t.Fatal("the asks are not in the context")
	}
	opts, body := Take(ctx)
	if opts.IsoLevel != pgx.ReadCommitted {
		t.Errorf("Take returned %+v", opts)
	}
	if IsQuietWhenEmpty(body) || From(body) != (pgx.TxOptions{}) {
		t.Errorf("the body's context still asks: quiet %v, options %+v", IsQuietWhenEmpty(body), From(body))
	}
	// Quiet alone is stripped too.
	if _, body := Take(QuietWhenEmpty(context.Background())); IsQuietWhenEmpty(body) {
		t.Error("the body's context is still quiet")
	}
}
