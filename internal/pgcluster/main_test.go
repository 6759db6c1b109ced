package pgcluster

import (
	"os"
	"testing"
)

// helperEnv makes the test binary act as a helper process instead of
// running the tests.
const helperEnv = "PGCLUSTER_HELPER_OWNER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		runHelperOwner()
	}
	os.Exit(m.Run())
}
