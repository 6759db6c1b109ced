package walsource

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"

	"github.com/annals-dev/annals/eventstore"
)

// decoder turns pgoutput (protocol 1) messages into Commits: it remembers
// the relations the server describes and collects the events table's inserts
// between BEGIN and COMMIT.
type decoder struct {
	schema    string
	relations map[uint32]*pglogrepl.RelationMessage
	cur       Commit
}

// decode handles one message; done reports a finished transaction in c.
func (d *decoder) decode(data []byte) (c Commit, done bool, err error) {
	msg, err := pglogrepl.Parse(data)
	if err != nil {
		return Commit{}, false, errors.Wrap(err, "walsource: parse pgoutput message")
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		d.relations[m.RelationID] = m
	case *pglogrepl.BeginMessage:
		d.cur = Commit{}
	case *pglogrepl.InsertMessage:
		rel, ok := d.relations[m.RelationID]
		if !ok {
			return Commit{}, false, errors.Newf("walsource: insert into unknown relation %d", m.RelationID)
		}
		if rel.Namespace != d.schema || rel.RelationName != "events" {
			return Commit{}, false, nil
		}
		e, err := eventFromTuple(rel, m.Tuple)
		if err != nil {
			return Commit{}, false, err
		}
		d.cur.Events = append(d.cur.Events, e)
		d.cur.Last = max(d.cur.Last, e.GlobalSequence)
	case *pglogrepl.CommitMessage:
		c = d.cur
		c.LSN = m.TransactionEndLSN
		d.cur = Commit{}
		return c, true, nil
	}
	return Commit{}, false, nil
}

// eventFromTuple decodes an events row sent in text format.
func eventFromTuple(rel *pglogrepl.RelationMessage, t *pglogrepl.TupleData) (eventstore.Event, error) {
	var e eventstore.Event
	if t == nil || len(t.Columns) != len(rel.Columns) {
		return e, errors.New("walsource: events row does not match its relation")
	}
	for i, col := range t.Columns {
		if col.DataType == 'n' {
			continue
		}
		if col.DataType != 't' {
			return e, errors.Newf("walsource: column %s sent as %q, want text", rel.Columns[i].Name, col.DataType)
		}
		v := string(col.Data)
		var err error
		switch rel.Columns[i].Name {
		case "global_sequence":
			e.GlobalSequence, err = strconv.ParseInt(v, 10, 64)
		case "event_id":
			e.ID, err = uuid.Parse(v)
		case "stream_id":
			e.StreamID = v
		case "stream_version":
			e.StreamVersion, err = strconv.ParseInt(v, 10, 64)
		case "event_type":
			e.Type = v
		case "data":
			e.Data = append(json.RawMessage(nil), col.Data...) // the receive buffer is reused
		case "metadata":
			err = json.Unmarshal(col.Data, &e.Metadata)
		case "recorded_at":
			e.RecordedAt, err = parseTimestamptz(v)
		}
		if err != nil {
			return e, errors.Wrapf(err, "walsource: decode column %s", rel.Columns[i].Name)
		}
	}
	return e, nil
}

// parseTimestamptz parses timestamptz output in the ISO DateStyle
// (replication connections use the server's; annals's are ISO).
func parseTimestamptz(s string) (time.Time, error) {
	for _, layout := range []string{"2006-01-02 15:04:05.999999-07", "2006-01-02 15:04:05.999999-07:00", "2006-01-02 15:04:05.999999-07:00:00"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, errors.Newf("walsource: timestamp %q", s)
}
