package verify

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
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
	// ServerMajor is the major version of the PostgreSQL that deparsed
	// the SQL-standard bodies (Deparsed): another major may print them
	// otherwise.
	ServerMajor int `json:"server_major"`
	// Functions by name and identity arguments.
	Functions map[string]function `json:"functions"`
}

// function is one function of the schema as manifest records it.
type function struct {
	Body    string   `json:"body_sha256"`
	Definer bool     `json:"security_definer"`
	Config  []string `json:"config"`
	// Strict: returns NULL on a NULL argument without running (ALTER
	// FUNCTION ... STRICT leaves the body as it is, and a check called
	// with a NULL argument then passes everything).
	Strict bool `json:"strict"`
	// Volatility: immutable, stable or volatile.
	Volatility string `json:"volatility"`
	// Deparsed is set for an SQL-standard body (BEGIN ATOMIC, RETURN),
	// which PostgreSQL stores parsed and Body hashes as pg_get_functiondef
	// prints it.
	Deparsed bool `json:"deparsed,omitempty"`
	// What calls it may take, for overloads (not in the manifest): its
	// input arguments, how many have defaults, whether it is variadic.
	nargs, ndefaults int
	variadic         bool
}

// takesCallsOf reports whether f could be picked for a call of the same
// name written for g (as many arguments as g takes).
func (f function) takesCallsOf(g function) bool {
	return f.variadic || (f.nargs-f.ndefaults <= g.nargs && g.nargs <= f.nargs)
}

func loadManifest() (*manifest, error) {
	var m manifest
	if err := json.Unmarshal(functionsJSON, &m); err != nil {
		return nil, errors.Wrap(err, "verify: functions.json")
	}
	return &m, nil
}

// normalizeBody replaces in a function body of schema what the migrations'
// templates put there for it (sqltmpl.Data: the schema as an identifier,
// always quoted and always followed by a name, and as a literal, the
// channel, the sequences, the append lock's key) by the placeholder, so
// that the bodies of schemas of any name compare. A body PostgreSQL
// deparsed (sqlBody: pg_get_functiondef, read with the schema on the
// search_path, so that only its header names the schema, as ident, which
// is quote_ident's) has its header's name replaced instead. Only those
// forms are replaced: the bare name is an alias or a word in many bodies
// (a schema named e, s or events had functions reported replaced).
func normalizeBody(body, schema string, sqlBody bool, ident string) string {
	d := sqltmpl.NewData(schema)
	if sqlBody {
		for _, kind := range []string{"FUNCTION", "PROCEDURE"} {
			head := "CREATE OR REPLACE " + kind + " " + ident + "."
			if strings.HasPrefix(body, head) {
				return "CREATE OR REPLACE " + kind + " {{.Schema}}." + body[len(head):]
			}
		}
		return body
	}
	// The longest first: the sequences' literals hold the schema's name.
	for _, r := range []struct{ value, name string }{
		{d.EventsSequence, "{{.EventsSequence}}"},
		{d.ArchiveStepSequence, "{{.ArchiveStepSequence}}"},
		{d.Channel, "{{.Channel}}"},
		{d.SchemaLiteral, "{{.SchemaLiteral}}"},
		{d.Schema + ".", "{{.Schema}}."},
	} {
		body = strings.ReplaceAll(body, r.value, r.name)
	}
	for _, r := range []struct {
		value int32
		name  string
	}{{d.AppendLockK1, "{{.AppendLockK1}}"}, {d.AppendLockK2, "{{.AppendLockK2}}"}} {
		body = replaceNumber(body, strconv.Itoa(int(r.value)), r.name)
	}
	return body
}

// replaceNumber replaces number in s where it stands alone (no digit
// before or after it).
func replaceNumber(s, number, name string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, number)
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		end := i + len(number)
		alone := (i == 0 || !isDigit(s[i-1])) && (end == len(s) || !isDigit(s[end]))
		b.WriteString(s[:i])
		if alone {
			b.WriteString(name)
		} else {
			b.WriteString(number)
		}
		s = s[end:]
	}
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// ownValue is the function whose body holds a value of the database's
// own (migration 0038 makes it return the head of the log when it ran): its
// body is not compared, but the value is, with the deletion records (the
// DeletionsRecordedAfter check of Log).
const ownValue = "deletions_recorded_after()"

// historic are sets of function bodies that builds of annals made and the
// migrations no longer make: a migration edited in place after those builds
// (before a release, on the main branch for up to 80 minutes). Up never
// applies a migration again, so a schema such a build migrated keeps its
// bodies through every upgrade until a later migration replaces them; they
// are annals' own, not a change of the owner's. A set counts only where one
// of its functions has its old body (see historicBodies; "" names a
// function the build did not make) and only while the manifest's body of
// each is still current: a migration that replaces one of them makes the
// set void, and its upgrade gives every schema the new body anyway. Definer and settings
// are compared as for any function. TestHistoricFunctionBodies rebuilds
// each (testdata/historic: the files as those builds had them).
var historic = []struct {
	why    string
	bodies map[string]struct{ old, current string }
}{{
	// 7d2ed4d (2026-11-29 16:43) until 748c1bb (18:03): no
	// data_unstorable; event_input_bad asked jsonb's range of every
	// event's data, append_batch_refuse asked another rule than
	// event_input_bad's (it named an earlier event in its refusal).
	// Migration 0045 made data_unstorable and event_input_bad anew in
	// every schema, so only append_batch_refuse is left of this set.
	why: "0032 as built at 7d2ed4d",
	bodies: map[string]struct{ old, current string }{
		"append_batch_refuse(p_streams text[], p_expected bigint[], p_append integer[], p_index integer[], p_ids uuid[], p_types text[], p_data text[], p_metadata text[])": {"03cc97df888d32fadc59f7dab82b37cbc9509734fed1688020e3770b4317d491", "b3018be0acc8c673437969b896b56f044f9799a3d018a68a0c425e3968a9abe2"},
	},
}, {
	// 433cd15 (17:32) until 748c1bb: event_input_bad asks the range only
	// of data holding "$personal", append_batch_refuse as at 7d2ed4d
	// (what is left of the set after 0045, as above).
	why: "0032 as built at 433cd15",
	bodies: map[string]struct{ old, current string }{
		"append_batch_refuse(p_streams text[], p_expected bigint[], p_append integer[], p_index integer[], p_ids uuid[], p_types text[], p_data text[], p_metadata text[])": {"03cc97df888d32fadc59f7dab82b37cbc9509734fed1688020e3770b4317d491", "b3018be0acc8c673437969b896b56f044f9799a3d018a68a0c425e3968a9abe2"},
	},
}, {
	// 62d5044 (2026-11-29 20:29) until bb736fa (20:50): metadata_ok's
	// short cut for metadata of 256 bytes or less also took a compressed
	// jsonb's size, so delete_stream's metadata read from a table could
	// pass the size limits unlisted (bb736fa).
	why: "0035 as built at 62d5044",
	bodies: map[string]struct{ old, current string }{
		"metadata_ok(p_md jsonb)": {"6c59bcede519220325d9288f1aa0ff4b8763ff5ba366d10b8a6c20acc06e99b3", "5598d3968ebf1ed5512a872d505793a66fec2d71c9638166f00169b4b6312130"},
	},
}}

// historicBodies returns the functions of got whose body is one of a
// historic set's, which m's bodies replace: a set is recognized when one
// function it names has its old body (not merely a function missing), and
// then each function that has its old body, or is missing where the set
// names none, is accepted; the others are compared as any.
func historicBodies(m *manifest, got map[string]function) map[string]bool {
	out := map[string]bool{}
	for _, set := range historic {
		var its []string
		current, recognized := true, false
		for name, b := range set.bodies {
			current = current && m.Functions[name].Body == b.current
			switch g, ok := got[name]; {
			case b.old == "" && !ok:
				its = append(its, name)
			case b.old != "" && ok && g.Body == b.old:
				its, recognized = append(its, name), true
			}
		}
		if current && recognized {
			for _, name := range its {
				out[name] = true
			}
		}
	}
	return out
}

// readFunctions returns the functions of schema as manifest records them.
func readFunctions(ctx context.Context, tx pgx.Tx, q map[string]string, schema string) (map[string]function, error) {
	if _, err := tx.Exec(ctx, q["SchemaOnSearchPath"]); err != nil {
		return nil, errors.Wrap(err, "verify: set the search_path")
	}
	rows, err := tx.Query(ctx, q["Functions"])
	if err != nil {
		return nil, errors.Wrap(err, "verify: read the schema's functions")
	}
	out := map[string]function{}
	var (
		proname, args, src, ident string
		def                       *string
		f                         function
	)
	_, err = pgx.ForEachRow(rows, []any{&proname, &args, &src, &def, &f.Definer, &f.Config, &ident, &f.Strict, &f.Volatility, &f.nargs, &f.ndefaults, &f.variadic}, func() error {
		name, body, sqlBody := proname+"("+args+")", src, def != nil
		if sqlBody {
			body = *def
			f.Deparsed = true
		}
		if name != ownValue {
			sum := sha256.Sum256([]byte(normalizeBody(body, schema, sqlBody, ident)))
			f.Body = hex.EncodeToString(sum[:])
		}
		for i, c := range f.Config {
			f.Config[i] = normalizeBody(c, schema, false, ident)
		}
		slices.Sort(f.Config)
		if f.Config == nil {
			f.Config = []string{}
		}
		out[name] = f
		f = function{}
		return nil
	})
	if err != nil {
		return nil, errors.Wrap(err, "verify: read the schema's functions")
	}
	// Every later query of the transaction under the pinned path again.
	if _, err := tx.Exec(ctx, q["PinSearchPath"]); err != nil {
		return nil, errors.Wrap(err, "verify: pin the search_path")
	}
	return out, nil
}

// checkFunctions reports every function of the schema at m's version that
// is missing or differs from what the migrations made (its body, whether it
// runs as its owner, its settings): the owner may replace them, and they
// are the code that writes the log (the append functions) and guards it
// (events_append_only, the trigger's function).
//
// A schema at another version, or whose version cannot be read (no
// schema_migrations, as when the SQL of annals migrate --print was applied
// by another tool; no SELECT on it), is compared too, but a function that
// differs is not a problem there: an older or newer annals may have made
// it. If any differs, a note names them and says why they could not be
// judged; if none does, the schema has annals' own functions and nothing
// is said.
func checkFunctions(ctx context.Context, tx pgx.Tx, q map[string]string, rep *Report, c Config) error {
	m, err := loadManifest()
	if err != nil {
		return err
	}
	var hasMig, canMig bool
	if err := tx.QueryRow(ctx, q["CanReadMigrations"]).Scan(&hasMig, &canMig); err != nil {
		return errors.Wrap(err, "verify: look up schema_migrations")
	}
	version := -1
	if canMig {
		if err := tx.QueryRow(ctx, q["SchemaVersion"]).Scan(&version); err != nil {
			return errors.Wrap(err, "verify: read the schema's version")
		}
	}
	var major int
	if err := tx.QueryRow(ctx, q["ServerMajor"]).Scan(&major); err != nil {
		return errors.Wrap(err, "verify: read the server's version")
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
	old := historicBodies(m, got)
	var differ, deparsed []string
	for _, name := range names {
		want := m.Functions[name]
		g, ok := got[name]
		var wrong string
		if ok && g.Body != want.Body && !old[name] && g.Deparsed && major != m.ServerMajor {
			// Printed by another PostgreSQL than the reference: a body
			// that differs may be the same function (its settings and
			// owner rights are still compared below).
			deparsed = append(deparsed, name)
		}
		switch {
		case !ok && old[name]:
			continue
		case !ok:
			wrong = "is missing"
		case g.Body != want.Body && !old[name] && !(g.Deparsed && major != m.ServerMajor):
			wrong = "has a body other than annals' own (replaced)"
		case g.Definer != want.Definer:
			wrong = fmt.Sprintf("runs as its %s, not as its %s", map[bool]string{true: "owner", false: "caller"}[g.Definer], map[bool]string{true: "owner", false: "caller"}[want.Definer])
		case !slices.Equal(g.Config, want.Config):
			wrong = fmt.Sprintf("has the settings %q, not %q", g.Config, want.Config)
		case g.Strict != want.Strict:
			wrong = map[bool]string{true: "is strict (returns NULL on a NULL argument without running), not called on NULL input",
				false: "is called on NULL input, not strict"}[g.Strict]
		case g.Volatility != want.Volatility:
			wrong = fmt.Sprintf("is %s, not %s", g.Volatility, want.Volatility)
		default:
			continue
		}
		if version != m.Version {
			differ = append(differ, name)
			continue
		}
		rep.add(c.MaxProblems, Problem{Kind: GuardRemoved,
			Message: fmt.Sprintf("%s.%s %s: the schema's owner or a superuser changed it, and with it what writes or guards the log", schemaname.Ident(c.Schema), name, wrong)})
	}
	// A function of the schema that annals did not make but named as one
	// of its own (another signature) and able to take its calls (as many
	// arguments): the eventstore calls its functions by name with
	// parameters the server types, and PostgreSQL picks the overload whose
	// parameter types it prefers (text, double precision), so the owner's
	// overload runs instead of annals' unchanged function. (A function of
	// another arity, a user's own in public, say, takes none.)
	own := map[string][]function{}
	for _, name := range names {
		base := name[:strings.IndexByte(name, '(')]
		g, ok := got[name]
		if !ok {
			g = function{variadic: true} // missing: any arity may be meant
		}
		own[base] = append(own[base], g)
	}
	extra := make([]string, 0)
	for name, f := range got {
		if _, ok := m.Functions[name]; ok {
			continue
		}
		if slices.ContainsFunc(own[name[:strings.IndexByte(name, '(')]], func(g function) bool {
			return f.takesCallsOf(g) || g.variadic
		}) {
			extra = append(extra, name)
		}
	}
	slices.Sort(extra)
	for _, name := range extra {
		if version != m.Version {
			differ = append(differ, name)
			continue
		}
		rep.add(c.MaxProblems, Problem{Kind: GuardRemoved,
			Message: fmt.Sprintf("%s.%s is an overload of an annals function that annals did not make: the schema's owner or a superuser created it, "+
				"and a call of the name with parameters the server types (as the eventstore's) may run it instead of annals' own", schemaname.Ident(c.Schema), name)})
	}
	const show = 5
	list := func(names []string) string {
		s := strings.Join(names[:min(len(names), show)], ", ")
		if len(names) > show {
			s += fmt.Sprintf(" and %d more", len(names)-show)
		}
		return s
	}
	if len(deparsed) > 0 {
		rep.note(NoteServer, fmt.Sprintf("%d of the schema's functions (%s) have SQL-standard bodies, which PostgreSQL %d prints otherwise than PostgreSQL %d, "+
			"on which this annals verify's reference was made: their bodies could not be judged (their settings and owner rights were)",
			len(deparsed), list(deparsed), major, m.ServerMajor))
	}
	if len(differ) == 0 {
		return nil
	}
	which := list(differ)
	cause, why := NoteVersion, ""
	switch {
	case !hasMig:
		why = "the schema has no schema_migrations, which says what they should be (the SQL of 'annals migrate --print' applied by another tool does not record its migrations): " +
			"the script of an older annals may have made them, or they were changed; compare them with the script that made the schema"
	case !canMig:
		cause = NotePrivileges
		why = "no SELECT on schema_migrations, which says what they should be (annals grant operator gives it)"
	case version < m.Version:
		why = fmt.Sprintf("the schema is at migration %d, older than this annals verify's %d: 'annals migrate' upgrades it, or verify with the annals that migrated it", version, m.Version)
	default:
		why = fmt.Sprintf("the schema is at migration %d, newer than this annals verify's %d: verify with the annals that migrated it", version, m.Version)
	}
	rep.note(cause, fmt.Sprintf("%d of the schema's functions (%s) are not those of migration %d and could not be judged: %s", len(differ), which, m.Version, why))
	return nil
}
