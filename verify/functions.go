package verify

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/sqltmpl"
)

// functions.json is what the functions of an annals schema at the newest
// migration look like: each function's body (with the schema's name and
// what is derived from it taken out) as a SHA-256, whether it runs as its
// owner, and its settings. TestFunctionsManifest writes it (go test
// ./verify -run TestFunctionsManifest -update) and fails while it is not
// what the migrations make.
//
//go:embed functions.json
var functionsJSON []byte

// manifest is functions.json.
type manifest struct {
	// Version is the schema version (newest migration) it describes.
	Version int `json:"version"`
	// Functions by name and identity arguments.
	Functions map[string]function `json:"functions"`
}

// function is one function of the schema as manifest records it.
type function struct {
	Body    string   `json:"body_sha256"`
	Definer bool     `json:"security_definer"`
	Config  []string `json:"config"`
}

func loadManifest() (*manifest, error) {
	var m manifest
	if err := json.Unmarshal(functionsJSON, &m); err != nil {
		return nil, errors.Wrap(err, "verify: functions.json")
	}
	return &m, nil
}

// normalizeBody replaces in a function body of schema what the migrations'
// templates put there for it (sqltmpl.Data: the schema as an identifier and
// a literal, the channel, the sequences, the append lock's key) by the
// placeholder, so that the bodies of schemas of any name compare.
func normalizeBody(body, schema string) string {
	d := sqltmpl.NewData(schema)
	// The longest first: the sequences' literals hold the schema's name.
	for _, r := range []struct{ value, name string }{
		{d.EventsSequence, "{{.EventsSequence}}"},
		{d.ArchiveStepSequence, "{{.ArchiveStepSequence}}"},
		{d.Channel, "{{.Channel}}"},
		{d.SchemaLiteral, "{{.SchemaLiteral}}"},
		{d.Schema, "{{.Schema}}"},
		{strconv.Itoa(int(d.AppendLockK1)), "{{.AppendLockK1}}"},
		{strconv.Itoa(int(d.AppendLockK2)), "{{.AppendLockK2}}"},
	} {
		body = strings.ReplaceAll(body, r.value, r.name)
	}
	// pg_get_functiondef (SQL-standard bodies) names the schema as
	// quote_ident does: bare when it is a plain lower-case name.
	if plainIdent.MatchString(schema) {
		body = strings.ReplaceAll(body, " "+schema+".", " {{.Schema}}.")
	}
	return body
}

// plainIdent matches a name quote_ident leaves bare (keywords aside).
var plainIdent = regexp.MustCompile(`^[a-z_][a-z0-9_$]*$`)

// ownValue is the function whose body holds a value of the database's
// own (migration 0038 makes it return the head of the log when it ran): its
// body is not compared, but the value is, with the deletion records (the
// DeletionsRecordedAfter check of Log).
const ownValue = "deletions_recorded_after()"

// readFunctions returns the functions of schema as manifest records them.
func readFunctions(ctx context.Context, tx pgx.Tx, q map[string]string, schema string) (map[string]function, error) {
	if _, err := tx.Exec(ctx, q["PinSearchPath"]); err != nil {
		return nil, errors.Wrap(err, "verify: pin the search_path")
	}
	rows, err := tx.Query(ctx, q["Functions"])
	if err != nil {
		return nil, errors.Wrap(err, "verify: read the schema's functions")
	}
	out := map[string]function{}
	var (
		name, body string
		f          function
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &body, &f.Definer, &f.Config}, func() error {
		if name != ownValue {
			sum := sha256.Sum256([]byte(normalizeBody(body, schema)))
			f.Body = hex.EncodeToString(sum[:])
		}
		for i, c := range f.Config {
			f.Config[i] = normalizeBody(c, schema)
		}
		slices.Sort(f.Config)
		if f.Config == nil {
			f.Config = []string{}
		}
		out[name] = f
		f = function{}
		return nil
	})
	return out, errors.Wrap(err, "verify: read the schema's functions")
}

// checkFunctions reports every function of the schema at m's version that
// is missing or differs from what the migrations made (its body, whether it
// runs as its owner, its settings): the owner may replace them, and they
// are the code that writes the log (the append functions) and guards it
// (events_append_only, the trigger's function). A schema at another version
// is not compared (a note says so).
func checkFunctions(ctx context.Context, tx pgx.Tx, q map[string]string, rep *Report, c Config) error {
	m, err := loadManifest()
	if err != nil {
		return err
	}
	var canMig bool
	if err := tx.QueryRow(ctx, q["CanReadMigrations"]).Scan(&canMig); err != nil {
		return errors.Wrap(err, "verify: look up schema_migrations")
	}
	if !canMig {
		rep.Notes = append(rep.Notes, "the schema's functions were not compared with annals' own: no SELECT on schema_migrations, which says what they should be")
		return nil
	}
	var version int
	if err := tx.QueryRow(ctx, q["SchemaVersion"]).Scan(&version); err != nil {
		return errors.Wrap(err, "verify: read the schema's version")
	}
	if version != m.Version {
		rep.Notes = append(rep.Notes, fmt.Sprintf("the schema's functions were not compared with annals' own: the schema is at migration %d, and this verify knows those of %d", version, m.Version))
		return nil
	}
	got, err := readFunctions(ctx, tx, q, c.Schema)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(m.Functions))
	for name := range m.Functions {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		want := m.Functions[name]
		g, ok := got[name]
		var wrong string
		switch {
		case !ok:
			wrong = "is missing"
		case g.Body != want.Body:
			wrong = "has a body other than annals' own (replaced)"
		case g.Definer != want.Definer:
			wrong = fmt.Sprintf("runs as its %s, not as its %s", map[bool]string{true: "owner", false: "caller"}[g.Definer], map[bool]string{true: "owner", false: "caller"}[want.Definer])
		case !slices.Equal(g.Config, want.Config):
			wrong = fmt.Sprintf("has the settings %q, not %q", g.Config, want.Config)
		default:
			continue
		}
		rep.add(c.MaxProblems, Problem{Kind: GuardRemoved,
			Message: fmt.Sprintf("%s.%s %s: the schema's owner or a superuser changed it, and with it what writes or guards the log", schemaname.Ident(c.Schema), name, wrong)})
	}
	return nil
}
