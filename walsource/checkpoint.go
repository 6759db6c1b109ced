package walsource

import (
	_ "embed"

	"github.com/annals-dev/annals/internal/sqltmpl"
)

//go:embed queries.sql
var queriesSQL string

// checkpointSQL reads a subscriber partition's checkpoint position (0 when
// it has none).
func checkpointSQL(schema string) (string, error) {
	q, err := sqltmpl.Named("queries.sql", queriesSQL, sqltmpl.NewData(schema))
	return q["Checkpoint"], err
}
