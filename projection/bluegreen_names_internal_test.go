package projection

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// unscopedForm is the form of every unscoped generation schema name.
var unscopedForm = regexp.MustCompile(`^rm_[a-z0-9_]+_g[0-9]+$`)

// TestGenerationSchemaNames: generation gen of a projection has two names,
// the unscoped rm_<name>_g<gen> annals has always given, and one scoped to
// the annals schema, which it takes when the unscoped one is taken. Both
// stay within PostgreSQL's 63 bytes, the scoped names of two annals schemas
// differ, and a scoped name is never the unscoped name of any projection's
// generation (an unscoped name ends in _g and digits). forgedSchema accepts
// exactly those two names of the generation in its annals schema: not
// another annals schema's scoped name, nor another generation's.
func TestGenerationSchemaNames(t *testing.T) {
	long := strings.Repeat("n", 70)
	for _, name := range []string{"bgstats", "Orders-View", long, "bgstats_g1", "x"} {
		for _, gen := range []int{1, 12, 1 << 30} {
			u, a := generationSchemas("tenant_a", name, gen)
			u2, b := generationSchemas("tenant_b", name, gen)
			u3, d := generationSchemas("annals", name, gen)
			if u != generationSchema(name, gen) || u2 != u || u3 != u {
				t.Errorf("%q g%d: unscoped %q %q %q, want %q in every annals schema", name, gen, u, u2, u3, generationSchema(name, gen))
			}
			if a == b || a == d || b == d {
				t.Errorf("%q g%d: scoped annals %q, tenant_a %q, tenant_b %q: want three names", name, gen, d, a, b)
			}
			for _, s := range []string{u, a, b, d} {
				if len(s) > 63 || !strings.HasPrefix(s, "rm_") {
					t.Errorf("%q: %d bytes", s, len(s))
				}
			}
			if !unscopedForm.MatchString(u) || unscopedForm.MatchString(a) || unscopedForm.MatchString(d) {
				t.Errorf("unscoped %q, scoped %q and %q: want only the first of the form rm_..._g<N>", u, a, d)
			}
			if !strings.Contains(a, "_g"+strconv.Itoa(gen)+"_") {
				t.Errorf("scoped %q does not hold _g%d_", a, gen)
			}
			for _, s := range []string{u, a} {
				if err := forgedSchema("tenant_a", name, gen, s); err != nil {
					t.Errorf("tenant_a: %q g%d naming %q: %v, want accepted", name, gen, s, err)
				}
			}
			_, next := generationSchemas("tenant_a", name, gen+1)
			for _, s := range []string{b, d, next, generationSchema(name, gen+1), "public", u + "_x"} {
				if err := forgedSchema("tenant_a", name, gen, s); !errors.Is(err, ErrForgedGeneration) {
					t.Errorf("tenant_a: %q g%d naming %q: %v, want ErrForgedGeneration", name, gen, s, err)
				}
			}
		}
	}
}
