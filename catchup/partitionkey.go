package catchup

import (
	"strings"

	"github.com/cockroachdb/errors"
)

// What a partitioned subscriber hashes to pick an event's partition
// (Subscription.PartitionBy). Events with the same key are in the same
// partition, read in position order, so per-key order holds.
const (
	// PartitionByStream hashes the stream ID (the default): per-stream order.
	PartitionByStream = "stream"
	// PartitionByCategory hashes the stream's category, the part of its ID
	// before the first "-" (all of it when there is none): every stream of
	// a category in one partition, so per-category order holds.
	PartitionByCategory = "category"
	// PartitionByMetadataPrefix followed by a field name hashes that
	// top-level field of the event's metadata as text ("metadata:tenant_id"):
	// per-tenant order. Events without the field share the key "".
	PartitionByMetadataPrefix = "metadata:"
)

// ErrInvalidPartitionBy is returned for a PartitionBy that is none of the
// above.
var ErrInvalidPartitionBy = errors.New("catchup: invalid partition key")

// partitionKey is a parsed PartitionBy: the kind ReadBatch's CASE selects
// ("stream", "category", "metadata") and the metadata field.
type partitionKey struct{ kind, field string }

// ParsePartitionBy checks a PartitionBy value ("" is PartitionByStream).
func ParsePartitionBy(s string) error {
	_, err := parsePartitionBy(s)
	return err
}

func parsePartitionBy(s string) (partitionKey, error) {
	switch {
	case s == "" || s == PartitionByStream:
		return partitionKey{kind: PartitionByStream}, nil
	case s == PartitionByCategory:
		return partitionKey{kind: PartitionByCategory}, nil
	case strings.HasPrefix(s, PartitionByMetadataPrefix):
		f := strings.TrimPrefix(s, PartitionByMetadataPrefix)
		if f == "" || len(f) > 200 {
			return partitionKey{}, errors.Wrapf(ErrInvalidPartitionBy, "%q: the metadata field name must have 1 to 200 bytes", s)
		}
		return partitionKey{kind: "metadata", field: f}, nil
	}
	return partitionKey{}, errors.Wrapf(ErrInvalidPartitionBy, "%q: want %q, %q or %q followed by a field name", s, PartitionByStream, PartitionByCategory, PartitionByMetadataPrefix)
}
