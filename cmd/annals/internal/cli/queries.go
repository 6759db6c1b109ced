package cli

import (
	_ "embed"

	"github.com/annals-dev/annals/internal/sqltmpl"
)

//go:embed queries.sql
var queriesSQL string

// queries renders the command line's statements for the --schema.
func (e *env) queries() (map[string]string, error) {
	if err := e.validSchema(); err != nil {
		return nil, err
	}
	return sqltmpl.Named("queries.sql", queriesSQL, sqltmpl.NewData(e.schema))
}
