package projectioncmd

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/projection"
)

// A tree mounted without a runner (as a service mounts it when it has no
// database, so that help still works) fails each command with an error
// that says so; it panicked with a nil pointer dereference.
func TestNoRunnerFailsEachCommand(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"list"}, {"status"}, {"status", "balances"}, {"rebuild", "balances", "--yes"},
		{"generations", "balances"}, {"rollback", "balances", "--yes"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("panicked: %v", p)
					}
				}()
				cmd := New(nil, nil, nil)
				var out, errOut bytes.Buffer
				cmd.SetArgs(args)
				cmd.SetOut(&out)
				cmd.SetErr(&errOut)
				err = cmd.ExecuteContext(t.Context())
			}()
			if !errors.Is(err, ErrNoRunner) || !strings.Contains(err.Error(), "no runner") || !strings.Contains(err.Error(), "Config.Open") {
				t.Fatalf("err = %v, want one that says there is no runner", err)
			}
		})
	}
}

// Config.Open gives a tree mounted without a runner its runner and pool,
// once, when a command runs: not for help nor for a mistake in the command
// line. Its error is the command's.
func TestOpenGivesTheRunnerWhenACommandRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	opened := 0
	var openErr error
	exec := func(args ...string) (string, error) {
		cmd := New(nil, nil, &Config{Open: func(ctx context.Context) (*projection.Runner, *pgxpool.Pool, error) {
			opened++
			if openErr != nil {
				return nil, nil, openErr
			}
			return b.runner, b.db.Pool, nil
		}})
		var out, errOut bytes.Buffer
		cmd.SetArgs(args)
		cmd.SetOut(&out)
		cmd.SetErr(&errOut)
		err := cmd.ExecuteContext(t.Context())
		return out.String(), err
	}
	if _, err := exec("--help"); err != nil || opened != 0 {
		t.Fatalf("--help: %v, opened %d times; want no error and no Open", err, opened)
	}
	if _, err := exec("rebuild"); !errors.Is(err, ErrUsage) || opened != 0 {
		t.Fatalf("rebuild without a name: %v, opened %d times; want a usage error and no Open", err, opened)
	}
	out, err := exec("list")
	if err != nil || opened != 1 || !strings.Contains(out, "balances") || !strings.Contains(out, "mailer") {
		t.Fatalf("list: %v, opened %d times, output:\n%s", err, opened, out)
	}
	openErr = errors.New("no DATABASE_URL")
	if _, err := exec("status"); !errors.Is(err, openErr) || opened != 2 {
		t.Fatalf("status with a failing Open: %v, opened %d times", err, opened)
	}
	openErr = nil
	nilOpen := New(nil, nil, &Config{Open: func(context.Context) (*projection.Runner, *pgxpool.Pool, error) { return nil, nil, nil }})
	nilOpen.SetArgs([]string{"list"})
	nilOpen.SetOut(&bytes.Buffer{})
	nilOpen.SetErr(&bytes.Buffer{})
	if err := nilOpen.ExecuteContext(t.Context()); !errors.Is(err, ErrNoRunner) {
		t.Fatalf("list with an Open that returns nil: %v, want ErrNoRunner", err)
	}
}
