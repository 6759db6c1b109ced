package projection

import (
	"strings"
	"testing"
	"time"
)

// TestRebuildBlocker: AutoRebuild does not build a version again that was
// live and rolled back, nor beside a newer version being built; a
// generation of the version retired before it went live, or replaced by a
// cut-over to an older version (which annals made before it refused them),
// does not keep it from building.
func TestRebuildBlocker(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) *time.Time { x := t0.Add(time.Duration(s) * time.Second); return &x }
	n := func(i int) *int { return &i }
	gen := func(g, v int, st GenerationState, live, retired *time.Time, replaced *int) Generation {
		return Generation{Generation: g, Version: v, State: st, LiveSince: live, RetiredAt: retired, Replaced: replaced}
	}
	for _, tc := range []struct {
		name    string
		gens    []Generation
		blocked bool
		why     string
	}{{
		// g1 → g3 (version 3), then a version-2 instance cut over 3 → 2.
		name: "replaced by an older version's cut-over",
		gens: []Generation{
			gen(1, 1, GenerationRetired, at(0), at(10), nil),
			gen(2, 2, GenerationLive, at(20), nil, n(3)),
			gen(3, 3, GenerationRetired, at(10), at(20), n(1)),
		},
	}, {
		name: "rolled back",
		gens: []Generation{
			gen(1, 1, GenerationLive, at(20), nil, nil),
			gen(2, 3, GenerationRetired, at(10), at(20), n(1)),
		},
		blocked: true, why: "version 3 (generation 2) was live and rolled back",
	}, {
		// g1 → g2 (version 3) → g3 (version 4), rolled back to g2, then to g1.
		name: "rolled back twice",
		gens: []Generation{
			gen(1, 1, GenerationLive, at(40), nil, nil),
			gen(2, 3, GenerationRetired, at(30), at(40), n(1)),
			gen(3, 4, GenerationRetired, at(20), at(30), n(2)),
		},
		blocked: true, why: "version 4 (generation 3) was live and rolled back",
	}, {
		// g1 → g2 (version 3) → g3 (version 3 rebuilt), then g3 rolled
		// back to g2 and g2 to g1.
		name: "a rebuild of the version rolled back",
		gens: []Generation{
			gen(1, 1, GenerationLive, at(40), nil, nil),
			gen(2, 3, GenerationRetired, at(30), at(40), n(1)),
			gen(3, 3, GenerationRetired, at(20), at(30), n(2)),
		},
		blocked: true, why: "version 3 (generation 3) was live and rolled back",
	}, {
		name: "retired before it went live",
		gens: []Generation{
			gen(1, 1, GenerationLive, at(0), nil, nil),
			gen(2, 3, GenerationRetired, nil, at(10), nil),
		},
	}, {
		name: "a newer version building",
		gens: []Generation{
			gen(1, 1, GenerationLive, at(0), nil, nil),
			gen(2, 4, GenerationBuilding, nil, nil, nil),
		},
		blocked: true, why: "generation 2, of version 4, is building",
	}, {
		name: "older versions only",
		gens: []Generation{
			gen(1, 1, GenerationRetired, at(0), at(10), nil),
			gen(2, 2, GenerationLive, at(10), nil, n(1)),
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			why, blocked := rebuildBlocker(tc.gens, 3)
			if blocked != tc.blocked || !strings.Contains(why, tc.why) {
				t.Fatalf("blocked %v, %q; want %v, %q", blocked, why, tc.blocked, tc.why)
			}
			r := &Runner{}
			if got := r.wantsGeneration(tc.gens, &blueGreenReg{cfg: BlueGreen{Version: 3, AutoRebuild: true}}); got == tc.blocked {
				t.Fatalf("wantsGeneration %v with the rebuild blocked %v", got, tc.blocked)
			}
		})
	}
}
