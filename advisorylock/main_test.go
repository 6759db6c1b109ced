package advisorylock_test

import (
	"os"
	"testing"

	"github.com/annals-dev/annals/annalstest"
)

// TestMain runs the tests, or, when the test binary was started as a
// child holding locks (ANNALS_ADVISORYLOCK_FREEZE_CHILD is set), that
// child instead.
func TestMain(m *testing.M) {
	if spec := os.Getenv(freezeChildEnv); spec != "" {
		os.Exit(runFreezeChild(spec))
	}
	annalstest.Main(m)
}
