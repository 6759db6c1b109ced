package sqltmpl

import (
	"bufio"
	"bytes"
	"strings"
	"text/template"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/internal/leadership"
	"github.com/annals-dev/annals/internal/schemaname"
)

// Data is what a template sees. Every string field is already quoted: a
// template must never put a placeholder inside quotes of its own (a test
// checks every .sql file of the module for that).
type Data struct {
	// Schema is the schema as a quoted identifier: "annals".
	Schema string
	// SchemaLiteral is the schema name as a quoted literal: E'annals'.
	SchemaLiteral string
	// Channel is the NOTIFY channel of appends as a quoted literal: E'annals_events'.
	Channel string
	// CheckpointChannel is the NOTIFY channel of checkpoint moves as a
	// quoted literal: E'annals_checkpoints'.
	CheckpointChannel string
	// FenceChannel is the NOTIFY channel of fences (checkpoint.FenceChannel)
	// as a quoted literal: E'annals_fences'.
	FenceChannel string
	// EventsSequence is the events' position sequence as a regclass
	// constant: E'"annals"."events_global_sequence"'::regclass.
	EventsSequence string
	// ArchiveStepSequence is the sequence holding the transaction ID of
	// the latest archive step, as a regclass constant (see migration 0015).
	ArchiveStepSequence string
	// AppendLockK1 and AppendLockK2 are the key of the append lock.
	AppendLockK1 int32
	AppendLockK2 int32
}

// NewData returns the template data for a (validated) schema name.
func NewData(schema string) Data {
	k1, k2 := schemaname.AppendLockKey(schema)
	return Data{
		Schema:              schemaname.Ident(schema),
		SchemaLiteral:       schemaname.Literal(schema),
		Channel:             schemaname.Literal(schemaname.Channel(schema)),
		CheckpointChannel:   schemaname.Literal(schemaname.CheckpointChannel(schema)),
		FenceChannel:        schemaname.Literal(schemaname.FenceChannel(schema)),
		EventsSequence:      schemaname.QualifiedLiteral(schema, "events_global_sequence") + "::regclass",
		ArchiveStepSequence: schemaname.QualifiedLiteral(schema, "archive_step_xact") + "::regclass",
		AppendLockK1:        k1,
		AppendLockK2:        k2,
	}
}

// AnnounceFence returns the SQL expression that announces the fence of
// subscriber partition (two SQL expressions, a text and an int) on
// FenceChannel: pg_notify with the hex MD5 of the UTF-8 bytes of
// "subscriber:partition", as checkpoint.FencePayload computes it. Templates
// call it as {{.AnnounceFence "c.subscriber_id" "c.partition"}}, so that
// the payload is written once.
func (d Data) AnnounceFence(subscriber, partition string) string {
	return "pg_catalog.pg_notify(" + d.FenceChannel + ", pg_catalog.md5(pg_catalog.convert_to((" +
		subscriber + ")::text || ':' || (" + partition + ")::int::text, 'UTF8')))"
}

// HeartbeatLeader returns the FROM-clause item that joins the heartbeat
// leader of each checkpoint row (alias checkpoint) as heartbeat_leader
// (instance_id, epoch), live instances being those whose heartbeat is
// younger than staleMicros microseconds (an SQL expression): see
// leadership.HeartbeatLeaderJoin. Templates call it as
// {{.HeartbeatLeader "c" "$1"}}, so that the rule is read alike by `annals
// status`, the console and the projections command tree.
func (d Data) HeartbeatLeader(checkpoint, staleMicros string) string {
	return leadership.HeartbeatLeaderJoin(d.Schema, checkpoint, staleMicros)
}

// WholeLog is the whole log (archived events, then the hot ones) as a
// parenthesized subquery of the two tables, with the columns of the view
// events_all: for a reader that must see the rows the tables hold, not what
// a view the schema's owner may replace shows (verify). Give it an alias.
func (d Data) WholeLog() string {
	const cols = "global_sequence, event_id, stream_id, stream_version, event_type, data, metadata, recorded_at"
	return "(SELECT " + cols + " FROM " + d.Schema + ".events_archive UNION ALL SELECT " + cols + " FROM " + d.Schema + ".events)"
}

// Render executes src as a template with data.
func Render(name, src string, data Data) (string, error) {
	t, err := template.New(name).Option("missingkey=error").Parse(src)
	if err != nil {
		return "", errors.Wrapf(err, "parse SQL template %s", name)
	}
	var buf bytes.Buffer
	if err := t.Execute(&buf, data); err != nil {
		return "", errors.Wrapf(err, "render SQL template %s", name)
	}
	return buf.String(), nil
}

// Named renders src and splits it into statements keyed by their "-- name:" line.
func Named(file, src string, data Data) (map[string]string, error) {
	out, err := Render(file, src, data)
	if err != nil {
		return nil, err
	}
	queries := map[string]string{}
	var name string
	var body strings.Builder
	flush := func() error {
		if name == "" {
			if !onlyComments(body.String()) {
				return errors.Newf("%s: SQL before the first -- name: line", file)
			}
			return nil
		}
		if _, dup := queries[name]; dup {
			return errors.Newf("%s: query %s defined twice", file, name)
		}
		queries[name] = strings.TrimSpace(body.String())
		return nil
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "-- name:"); ok {
			if err := flush(); err != nil {
				return nil, err
			}
			name = strings.TrimSpace(rest)
			body.Reset()
			continue
		}
		body.WriteString(line)
		body.WriteByte('\n')
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return queries, nil
}

// onlyComments reports whether sql holds nothing but blank lines and -- comments.
func onlyComments(sql string) bool {
	for _, line := range strings.Split(sql, "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "--") {
			return false
		}
	}
	return true
}
