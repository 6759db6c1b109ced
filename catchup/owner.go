package catchup

import (
	"fmt"
	"os"
)

// DefaultOwner returns "host:pid", the default name of this process in
// checkpoints and the instance registry.
func DefaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}
