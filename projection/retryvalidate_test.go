package projection_test

import (
	"math"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/projection"
)

// A retry policy that would make negative or nonsensical delays (a Jitter
// above 1 made some delays negative, instant retries; a NaN Multiplier made
// every delay -2562047h) is refused with ErrInvalidRetryPolicy, in
// Config.Retry (NewRunner) as in Options.Retry (Register); Config.Retry was
// not checked at all.
func TestRetryPolicyValidate(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	invalid := map[string]projection.RetryPolicy{
		"JitterAboveOne":   {Jitter: 5},
		"JitterNaN":        {Jitter: math.NaN()},
		"JitterInf":        {Jitter: math.Inf(-1)},
		"MultiplierNaN":    {Multiplier: math.NaN()},
		"MultiplierInf":    {Multiplier: math.Inf(1)},
		"MaxRetriesBelow":  {MaxRetries: -2},
		"NegativeDelay":    {InitialDelay: -time.Second},
		"NegativeMaxDelay": {MaxDelay: -time.Second},
	}
	for name, p := range invalid {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if err := p.Validate(); !errors.Is(err, projection.ErrInvalidRetryPolicy) {
				t.Errorf("Validate: %v, want ErrInvalidRetryPolicy", err)
			}
			if _, err := projection.NewRunner(db.Pool, &projection.Config{Retry: &p}); !errors.Is(err, projection.ErrInvalidRetryPolicy) {
				t.Errorf("NewRunner with Config.Retry: %v, want ErrInvalidRetryPolicy", err)
			}
			r, err := projection.NewRunner(db.Pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Register(namedObserver{"retry-" + name}, &projection.Options{Retry: &p}); !errors.Is(err, projection.ErrInvalidRetryPolicy) {
				t.Errorf("Register with Options.Retry: %v, want ErrInvalidRetryPolicy", err)
			}
		})
	}
	for name, p := range map[string]projection.RetryPolicy{
		"Zero":       {},
		"NoJitter":   {Jitter: -1},
		"FullJitter": {Jitter: 1},
		"NoRetries":  {MaxRetries: -1},
		"Custom":     {MaxRetries: 5, InitialDelay: time.Millisecond, Multiplier: 3, MaxDelay: time.Minute, Jitter: 0.5},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if err := p.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
			if _, err := projection.NewRunner(db.Pool, &projection.Config{Retry: &p}); err != nil {
				t.Errorf("NewRunner: %v", err)
			}
		})
	}
}

// Delay is never negative, and a delay past what a time.Duration holds
// (a MaxDelay near math.MaxInt64 with jitter on top) is the longest one
// rather than a negative one from the overflowing conversion.
func TestRetryPolicyDelayBounds(t *testing.T) {
	t.Parallel()
	full := projection.RetryPolicy{InitialDelay: time.Second, Multiplier: 2, MaxDelay: time.Minute, Jitter: 1}
	huge := projection.RetryPolicy{InitialDelay: time.Hour, Multiplier: 2, MaxDelay: math.MaxInt64, Jitter: 0.2}
	for i := range 1000 {
		if d := full.Delay(1 + i%8); d < 0 || d > 2*time.Minute {
			t.Fatalf("full jitter: Delay(%d) = %v", 1+i%8, d)
		}
		if d := huge.Delay(100); d < 0 {
			t.Fatalf("huge MaxDelay: Delay(100) = %v", d)
		}
	}
}
