package relay_test

import (
	"os"
	"testing"

	"github.com/annals-dev/annals/annalstest"
)

// TestMain runs the tests, or, when the test binary was started as a relay
// child process (ANNALS_RELAY_CHILD is set), a relay instead.
func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(runChild(spec))
	}
	annalstest.Main(m)
}
