package projectioncmd

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/projection"
)

// TestListAndStatusJSON: list and status --output json give arrays, never
// null, with null checkpoints before the first run; an unknown --output is
// a usage error.
func TestListAndStatusJSON(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fill(t, 50)

	// Before any run: no checkpoints.
	res := b.execute(t, false, "", "list", "--output", "json")
	if res.err != nil {
		t.Fatal(res.err)
	}
	var list []map[string]any
	if err := json.Unmarshal([]byte(res.stdout), &list); err != nil {
		t.Fatalf("%v in %q", err, res.stdout)
	}
	if len(list) != 3 || list[0]["name"] != "balances" || list[0]["checkpoint"] != nil || list[0]["lag"] != nil ||
		list[0]["subscriber"] != "balances" || list[0]["generation"] != nil || list[0]["generation_state"] != nil {
		t.Fatalf("list before a run: %v", list)
	}
	if l, ok := list[0]["leaders"].([]any); !ok || len(l) != 0 {
		t.Fatalf("leaders is %#v; want an empty array", list[0]["leaders"])
	}

	if err := b.runner.RunUntilCaughtUp(t.Context()); err != nil {
		t.Fatal(err)
	}
	res = b.execute(t, false, "", "list", "-o", "json")
	if res.err != nil {
		t.Fatal(res.err)
	}
	list = nil
	if err := json.Unmarshal([]byte(res.stdout), &list); err != nil {
		t.Fatalf("%v in %q", err, res.stdout)
	}
	if list[0]["checkpoint"] != float64(50) || list[0]["lag"] != float64(0) || list[0]["head"] != float64(50) ||
		list[1]["kind"] != "observer" || list[2]["partitions"] != float64(2) {
		t.Fatalf("list after a run: %v", list)
	}

	res = b.execute(t, false, "", "status", "sharded", "--output", "json")
	if res.err != nil {
		t.Fatal(res.err)
	}
	var st struct {
		Head       int64            `json:"head"`
		Partitions []map[string]any `json:"partitions"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &st); err != nil {
		t.Fatalf("%v in %q", err, res.stdout)
	}
	if st.Head != 50 || len(st.Partitions) != 2 || st.Partitions[1]["partition"] != float64(1) ||
		st.Partitions[0]["leader"] != "none" || st.Partitions[0]["lock_pid"] != nil || st.Partitions[0]["epoch"] == nil {
		t.Fatalf("status: %+v", st)
	}
	if !strings.Contains(res.stdout, `"partitions": [`) {
		t.Fatalf("status json: %s", res.stdout)
	}

	for _, args := range [][]string{{"list", "-o", "yaml"}, {"status", "--output", "jsonl"}} {
		if res := b.execute(t, false, "", args...); !errors.Is(res.err, ErrUsage) {
			t.Errorf("%v: %v; want a usage error", args, res.err)
		}
	}
	// Text is unchanged.
	res = b.execute(t, false, "", "list")
	if res.err != nil || !strings.Contains(lineOf(t, res.stdout, "balances"), "projection") {
		t.Fatalf("list: %v\n%s", res.err, res.stdout)
	}
}

// TestBlueGreenCommandsRefuse: generations of a name that is not registered
// (or not blue/green) is a usage error, not an empty table and success; a
// registered blue/green projection without generations lists none; rebuild
// --new-layout is refused for a blue/green read model, which changes its
// layout with a new BlueGreen.Version.
func TestBlueGreenCommandsRefuse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	v1 := blueGreenBundle(t, b, 1)

	res := v1.execute(t, false, "", "generations", "nosuch")
	if !errors.Is(res.err, ErrUsage) || !errors.Is(res.err, projection.ErrUnknownProjection) {
		t.Fatalf("generations of an unknown name: %v (stdout %q)", res.err, res.stdout)
	}
	if res = b.execute(t, false, "", "generations", "balances"); !errors.Is(res.err, ErrUsage) || !errors.Is(res.err, projection.ErrNotBlueGreen) {
		t.Fatalf("generations of a projection without blue/green: %v", res.err)
	}
	res = v1.execute(t, false, "", "generations", "counts", "-o", "json")
	if res.err != nil || strings.TrimSpace(res.stdout) != "[]" {
		t.Fatalf("generations before the first run: %v %q", res.err, res.stdout)
	}

	b.fill(t, 20)
	if err := v1.runner.RunUntilCaughtUp(t.Context()); err != nil {
		t.Fatal(err)
	}
	res = v1.execute(t, false, "", "rebuild", "counts", "--yes", "--new-layout")
	if !errors.Is(res.err, ErrUsage) || !strings.Contains(res.err.Error(), "raising BlueGreen.Version") {
		t.Fatalf("rebuild --new-layout of a blue/green projection: %v", res.err)
	}
	res = v1.execute(t, false, "", "generations", "counts", "-o", "json")
	var gens []projection.Generation
	if err := json.Unmarshal([]byte(res.stdout), &gens); err != nil || len(gens) != 1 {
		t.Fatalf("generations after the refused rebuild: %v %q", err, res.stdout)
	}
}
