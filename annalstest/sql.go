package annalstest

import (
	_ "embed"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/sqltmpl"
)

//go:embed database.sql
var databaseSQL string

// queries returns the named statements of database.sql. The file has no
// schema placeholders; sqltmpl only splits it.
var queries = sync.OnceValue(func() map[string]string {
	q, err := sqltmpl.Named("database.sql", databaseSQL, sqltmpl.NewData(schemaname.Default))
	if err != nil {
		panic(err) // the embedded file is fixed at build time; a test covers it
	}
	return q
})

// bind returns the named statement with :"db" and :"template" replaced by
// quoted identifiers.
func bind(name, db, template string) string {
	return strings.NewReplacer(
		`:"db"`, pgx.Identifier{db}.Sanitize(),
		`:"template"`, pgx.Identifier{template}.Sanitize(),
	).Replace(queries()[name])
}
