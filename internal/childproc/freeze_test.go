package childproc

import "testing"

func TestThreadState(t *testing.T) {
	for stat, want := range map[string]byte{
		"4242 (annals.test) S 1 4242 4242 0 -1": 'S',
		"4243 (a) b) (c) T 1 4242 4242 0 -1":    'T',
		"4244 (worker 1) t 1 4242":              't',
		"4245 (x) Z 1":                          'Z',
		"4246 (truncated":                       0,
		"4247 (x)":                              0,
		"4248 (x)S 1":                           0,
	} {
		if got := threadState(stat); got != want {
			t.Errorf("threadState(%q) = %q, want %q", stat, got, want)
		}
	}
}
