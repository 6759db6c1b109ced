package relay_test

import (
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/relay"
)

// A relay name with a carriage return or line feed is refused by New:
// NATS writes them as spaces in a header, so the relay's next run found its
// stream's newest message published by "a b", not by relay "a\nb", and
// refused its own stream. So are other control characters, and invalid
// UTF-8 (PostgreSQL refuses them in the checkpoint); tab is kept.
func TestNewRefusesAControlCharacterInTheName(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, name := range []string{"a\nb", "a\r\nb", "\n", "a\x00b", "a\x7fb", "a\u0085b", "a\xffb"} {
		if _, err := relay.New(b.db.Pool, b.nc, &relay.Config{Name: name}); !errors.Is(err, relay.ErrInvalidName) {
			t.Errorf("New with the name %q: %v, want ErrInvalidName", name, err)
		}
	}
	for _, name := range []string{"a\tb", " padded\t", "relay é"} {
		if _, err := relay.New(b.db.Pool, b.nc, &relay.Config{Name: name}); err != nil {
			t.Errorf("New with the name %q: %v", name, err)
		}
	}
}
