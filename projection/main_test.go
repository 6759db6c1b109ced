package projection_test

import (
	"os"
	"testing"

	"github.com/annals-dev/annals/annalstest"
)

// TestMain runs the tests, or, when the test binary was started by
// startChild (ANNALS_PROJECTION_CHILD is set), a runner process instead.
func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(runChild(spec))
	}
	if spec := os.Getenv(bgChildEnv); spec != "" {
		os.Exit(runBlueGreenChild(spec))
	}
	annalstest.Main(m)
}
