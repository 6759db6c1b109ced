package relay

import (
	_ "embed"

	"github.com/annals-dev/annals/internal/sqltmpl"
)

//go:embed queries.sql
var queriesSQL string

// queries returns the relay's named queries (queries.sql).
func (r *Relay) queries() (map[string]string, error) {
	return sqltmpl.Named("queries.sql", queriesSQL, sqltmpl.NewData(r.cfg.Schema))
}
