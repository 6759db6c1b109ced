package projection

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// unscoped is the form of every name unscopedGenerationSchema gives.
var unscoped = regexp.MustCompile(`^rm_[a-z0-9_]+_g[0-9]+$`)

// TestGenerationSchemaNames: a generation's schema depends on the annals
// schema outside the default one, stays within PostgreSQL's 63 bytes, and
// a scoped name is never the unscoped name of any projection's generation
// (an unscoped name ends in _g and digits; "x_g1_1a2b3c4d" as a projection
// name must not reach another's schema). forged accepts exactly the two
// names annals could have given the generation.
func TestGenerationSchemaNames(t *testing.T) {
	long := strings.Repeat("n", 70)
	for _, name := range []string{"bgstats", "Orders-View", long, "bgstats_g1", "x"} {
		for _, gen := range []int{1, 12, 1 << 30} {
			def := generationSchema("annals", name, gen)
			if want := unscopedGenerationSchema(name, gen); def != want {
				t.Errorf("default schema: %q, want the unscoped %q", def, want)
			}
			a, b := generationSchema("tenant_a", name, gen), generationSchema("tenant_b", name, gen)
			if a == b || a == def || b == def {
				t.Errorf("%q g%d: annals %q, tenant_a %q, tenant_b %q: want three names", name, gen, def, a, b)
			}
			for _, s := range []string{def, a, b} {
				if len(s) > 63 || !strings.HasPrefix(s, "rm_") {
					t.Errorf("%q: %d bytes", s, len(s))
				}
			}
			// Every unscoped name has the form of def; no scoped one has.
			if !unscoped.MatchString(def) || unscoped.MatchString(a) || unscoped.MatchString(b) {
				t.Errorf("unscoped %q, scoped %q and %q: want only the first of the form rm_..._g<N>", def, a, b)
			}
			if !strings.Contains(a, "_g"+strconv.Itoa(gen)+"_") {
				t.Errorf("scoped %q does not hold _g%d_", a, gen)
			}

			for schema, ok := range map[string][]string{
				"annals":   {def},
				"tenant_a": {a, def},
			} {
				for _, s := range ok {
					if err := forgedSchema(schema, name, gen, s); err != nil {
						t.Errorf("%s: %q g%d naming %q: %v, want accepted", schema, name, gen, s, err)
					}
				}
			}
			for schema, refused := range map[string][]string{
				"annals":   {a, b, unscopedGenerationSchema(name, gen+1), "public"},
				"tenant_a": {b, generationSchema("tenant_a", name, gen+1), unscopedGenerationSchema(name, gen+1), "public"},
			} {
				for _, s := range refused {
					if err := forgedSchema(schema, name, gen, s); !errors.Is(err, ErrForgedGeneration) {
						t.Errorf("%s: %q g%d naming %q: %v, want ErrForgedGeneration", schema, name, gen, s, err)
					}
				}
			}
		}
	}
}
