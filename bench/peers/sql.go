package main

import (
	"bytes"
	_ "embed"
	"strings"
	"text/template"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
)

//go:embed peers.sql
var peersSQL string

// query renders the statement called name in peers.sql for schema (quoted
// here) and, for statements that name one, table.
func query(name, schema string, table ...string) string {
	for _, part := range strings.Split(peersSQL, "-- name: ")[1:] {
		head, body, _ := strings.Cut(part, "\n")
		if strings.TrimSpace(head) != name {
			continue
		}
		data := map[string]string{"Schema": pgx.Identifier{schema}.Sanitize()}
		if len(table) > 0 {
			data["Table"] = pgx.Identifier{table[0]}.Sanitize()
		}
		var out bytes.Buffer
		if err := template.Must(template.New(name).Parse(body)).Execute(&out, data); err != nil {
			panic(errors.Wrapf(err, "peers.sql: %s", name))
		}
		return out.String()
	}
	panic("peers.sql: no statement " + name)
}
