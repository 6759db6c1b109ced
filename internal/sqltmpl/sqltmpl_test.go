package sqltmpl

import "testing"

func TestNamedSplitsAndRenders(t *testing.T) {
	t.Parallel()
	src := "-- A header comment.\n\n-- name: A\nSELECT 1 FROM {{.Schema}}.t;\n\n-- name: B\nSELECT {{.SchemaLiteral}};\n"
	q, err := Named("x.sql", src, NewData(`we"ird`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := q["A"], `SELECT 1 FROM "we""ird".t;`; got != want {
		t.Errorf("A = %q, want %q", got, want)
	}
	if got, want := q["B"], `SELECT E'we"ird';`; got != want {
		t.Errorf("B = %q, want %q", got, want)
	}
}

func TestNamedRejectsDuplicatesAndOrphans(t *testing.T) {
	t.Parallel()
	if _, err := Named("x.sql", "-- name: A\nSELECT 1;\n-- name: A\nSELECT 2;\n", NewData("s")); err == nil {
		t.Error("duplicate name accepted")
	}
	if _, err := Named("x.sql", "SELECT 1;\n-- name: A\nSELECT 2;\n", NewData("s")); err == nil {
		t.Error("statement without a name accepted")
	}
	if _, err := Named("x.sql", "-- name: A\nSELECT {{.Nope}};\n", NewData("s")); err == nil {
		t.Error("unknown placeholder accepted")
	}
}
