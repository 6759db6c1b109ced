package archive_test

import (
	"os"
	"testing"

	"github.com/annals-dev/annals/annalstest"
)

// TestMain runs the tests, or, when the test binary was started by
// startChild (childEnv is set), an archiver process instead.
func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(runChild(spec))
	}
	annalstest.Main(m)
}
