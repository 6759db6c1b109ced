package projection_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/annals-dev/annals/internal/childproc"
	"github.com/annals-dev/annals/projection"
)

// The runners of a blue/green projection share its live generation's
// partitions as they share a projection's without BlueGreen (⌊P/N⌋ or
// ⌈P/N⌉ each): the first one used to lead all of them.
func TestBlueGreenPartitionsAreBalanced(t *testing.T) {
	t.Parallel()
	const parts = 6
	b := setup(t)
	ctx := t.Context()
	var live []string
	for i := range 3 {
		id := fmt.Sprintf("bg%d", i)
		pool, err := childproc.Pool(ctx, b.db.URL, id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		r, err := projection.NewRunner(pool, &projection.Config{InstanceID: id, PollInterval: 100 * time.Millisecond, ShutdownTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(statsProjection(1), &projection.Options{Partitions: parts,
			BlueGreen: &projection.BlueGreen{Version: 1, CheckInterval: 100 * time.Millisecond}}); err != nil {
			t.Fatal(err)
		}
		bgRunInBackground(t, r)
		live = append(live, id)
	}
	d := waitBalanced(t, b.db, []string{bgName + "#g1"}, parts, live, 30*time.Second)
	t.Logf("generation 1's %d partitions balanced across %d runners in %v", parts, len(live), d)
}
