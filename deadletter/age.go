package deadletter

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
)

// maxAgeDays keeps an age within time.Duration (about 292 years).
const maxAgeDays = math.MaxInt64 / int64(24*time.Hour)

// ParseAge parses an age such as Purge's, as the CLI and the console take
// it: a Go duration with an optional leading number of days: 30d, 1d12h,
// 12h, 90m, 0s. It must not be negative.
func ParseAge(s string) (time.Duration, error) {
	bad := errors.New("want a duration like 30d, 12h or 1d12h")
	var days int64
	before, rest, hasDays := strings.Cut(s, "d")
	if !hasDays {
		rest = s
	} else {
		if before == "" || strings.Trim(before, "0123456789") != "" {
			return 0, bad
		}
		n, err := strconv.ParseInt(before, 10, 64)
		if err != nil || n > maxAgeDays {
			return 0, errors.New("too long")
		}
		days = n
	}
	var r time.Duration
	if rest != "" || !hasDays {
		if hasDays && (rest[0] == '+' || rest[0] == '-') {
			return 0, bad
		}
		var err error
		if r, err = time.ParseDuration(rest); err != nil {
			return 0, bad
		}
		if r < 0 {
			return 0, errors.New("must not be negative")
		}
	}
	d := time.Duration(days) * 24 * time.Hour
	if d > math.MaxInt64-r {
		return 0, errors.New("too long")
	}
	return d + r, nil
}
