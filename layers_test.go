package annals_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/annals-dev/annals"

// layers ranks the module's packages (by import-path prefix, relative to
// the module; the longest prefix wins). A package may import packages of
// its own rank or below, never above: the arrows flow
//
//	cmd, examples → testkit → annals → projection/saga/scheduler/aggregate
//	→ catchup → checkpoint/advisorylock/deadletter → eventstore/annalstest
//	→ migrations/failure → internal helpers
//
// A new package must be added here (the test says so).
var layers = map[string]int{
	"cmd":                    8,
	"examples":               8,
	"testkit":                7,
	".":                      6,
	"projection":             5,
	"saga":                   5,
	"scheduler":              5,
	"aggregate":              5,
	"verify":                 5,
	"console":                6, // reads every layer below; mounted by cmd and services
	"scavenge":               5, // a projection.Service that removes expired events
	"archive":                5, // moves old events to events_archive
	"walsource":              5, // wakes catchup subscriptions from a replication slot
	"relay":                  6, // a projection.Runner processor; natsconsumer beside it
	"bench":                  8, // benchmark programs (bench/relay; bench/peers is a module of its own)
	"catchup":                4,
	"checkpoint":             3,
	"advisorylock":           3,
	"deadletter":             3,
	"eventstore":             2,
	"annalstest":             2,
	"migrations":             1,
	"failure":                1,
	"internal":               0,
	"internal/poolconn":      3, // opens annals' own connections as the pool does; fills advisorylock.Config
	"internal/lockfallback":  2, // eventstore's and aggregate's switch to PostgreSQL's lock on pre-0034 schemas; wraps migrations.ErrNotMigrated
	"cmd/annals/internal":    8, // the CLI application's own internals
	"annalstest/pgcontainer": 2, // a module of its own; listed for completeness
}

// rank returns the rank of a package path relative to the module.
func rank(rel string) (int, bool) {
	best, r, ok := -1, 0, false
	for prefix, n := range layers {
		if rel == prefix || strings.HasPrefix(rel, prefix+"/") || (prefix == "." && rel == ".") {
			if len(prefix) > best {
				best, r, ok = len(prefix), n, true
			}
		}
	}
	return r, ok
}

type listedPackage struct {
	ImportPath string
	Imports    []string
}

func relative(path string) (string, bool) {
	if path == module {
		return ".", true
	}
	rel, ok := strings.CutPrefix(path, module+"/")
	return rel, ok
}

// arrowViolations returns every import that points up the layers, every
// example importing an internal package (examples must be copyable), and
// every package the layers do not rank.
func arrowViolations(pkgs []listedPackage) []string {
	var bad []string
	for _, p := range pkgs {
		from, ok := relative(p.ImportPath)
		if !ok {
			continue
		}
		rf, ok := rank(from)
		if !ok {
			bad = append(bad, fmt.Sprintf("%s is not ranked: add it to layers in layers_test.go", from))
			continue
		}
		for _, imp := range p.Imports {
			to, ok := relative(imp)
			if !ok {
				continue
			}
			rt, ok := rank(to)
			switch {
			case !ok:
				bad = append(bad, fmt.Sprintf("%s is not ranked: add it to layers in layers_test.go", to))
			case rt > rf:
				bad = append(bad, fmt.Sprintf("%s (rank %d) imports %s (rank %d): an arrow points up", from, rf, to, rt))
			case strings.HasPrefix(from, "examples/") && (to == "internal" || strings.HasPrefix(to, "internal/")):
				bad = append(bad, fmt.Sprintf("%s imports %s: examples use public API only", from, to))
			}
		}
	}
	sort.Strings(bad)
	return bad
}

// TestLayers reads the module's packages with `go list -json ./...` and
// checks that their imports only point down the layers.
func TestLayers(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-json", "./...").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []listedPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 15 {
		t.Fatalf("go list found %d packages; expected the whole module", len(pkgs))
	}
	for _, v := range arrowViolations(pkgs) {
		t.Error(v)
	}

	// The check itself catches a reversed arrow, an example reaching into
	// internal/, and an unranked package.
	planted := arrowViolations([]listedPackage{
		{ImportPath: module + "/projection", Imports: []string{module}},
		{ImportPath: module + "/eventstore", Imports: []string{module + "/catchup"}},
		{ImportPath: module + "/examples/x", Imports: []string{module + "/internal/sqltmpl"}},
		{ImportPath: module + "/newpkg"},
	})
	if len(planted) != 4 {
		t.Errorf("planted violations found: %q; want 4", planted)
	}
}
