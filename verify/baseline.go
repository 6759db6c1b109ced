package verify

import (
	"encoding/json"
	"io"
	"time"

	"github.com/cockroachdb/errors"
)

// BaselineFormat identifies the baseline file format.
const BaselineFormat = "annals-verify-baseline/1"

// ErrBadBaseline is returned for a baseline that cannot be read or does not
// belong to the schema verified.
var ErrBadBaseline = errors.New("verify: bad baseline")

// Baseline is a digest of the log at one time: a running SHA-256 over the
// rows in position order, with a checkpoint every so many events. A later
// run compares the same ranges and reports each one that differs. It holds
// no event data. Keep it where the database's owner cannot rewrite it (a
// different machine, object storage with retention, a signed commit):
// whoever can change both the log and the baseline can hide anything.
type Baseline struct {
	// Format is BaselineFormat.
	Format string `json:"format"`
	// Schema is the schema the baseline was taken of.
	Schema string `json:"schema"`
	// CreatedAt is when it was taken (UTC).
	CreatedAt time.Time `json:"created_at"`
	// Head is the highest position it covers; Events how many events.
	Head   int64 `json:"head"`
	Events int64 `json:"events"`
	// Digest is the running SHA-256 (hex) of the whole log through Head.
	Digest string `json:"digest"`
	// Checkpoints cut the positions 1..Head into ranges, in order.
	Checkpoints []Checkpoint `json:"checkpoints"`
}

// Checkpoint is the digest of one range of positions: the range starts
// after the previous checkpoint's Position (0 for the first) and ends at
// Position, inclusive.
type Checkpoint struct {
	// Position is the last position of the range.
	Position int64 `json:"position"`
	// Events is how many events the range holds.
	Events int64 `json:"events"`
	// Segment is the SHA-256 (hex) of the range's rows.
	Segment string `json:"segment_sha256"`
	// Running is the SHA-256 (hex) of every row through Position.
	Running string `json:"running_sha256"`
}

// ReadBaseline reads a baseline written by [Baseline.Write]. A file that is
// not one is an error matching [ErrBadBaseline].
func ReadBaseline(r io.Reader) (*Baseline, error) {
	var b Baseline
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return nil, errors.Wrapf(ErrBadBaseline, "not a baseline file: %v", err)
	}
	if err := b.valid(); err != nil {
		return nil, err
	}
	return &b, nil
}

// Write writes the baseline as indented JSON.
func (b *Baseline) Write(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	return errors.Wrap(enc.Encode(b), "verify: write the baseline")
}

func (b *Baseline) valid() error {
	if b.Format != BaselineFormat {
		return errors.Wrapf(ErrBadBaseline, "format %q, want %q", b.Format, BaselineFormat)
	}
	var last int64
	for i, cp := range b.Checkpoints {
		if cp.Position <= last || cp.Events < 0 || len(cp.Segment) != 64 || len(cp.Running) != 64 {
			return errors.Wrapf(ErrBadBaseline, "checkpoint %d (position %d) is malformed or out of order", i+1, cp.Position)
		}
		last = cp.Position
	}
	if last > b.Head {
		return errors.Wrapf(ErrBadBaseline, "a checkpoint at position %d is beyond the head %d", last, b.Head)
	}
	return nil
}
