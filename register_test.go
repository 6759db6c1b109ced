package annals_test

import (
	"context"
	"strings"
	"testing"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/saga"
	"github.com/annals-dev/annals/scheduler"
)

type regAccount struct{ aggregate.Base }

func (*regAccount) Apply(any) error { return nil }

type regService struct{}

func (regService) Run(ctx context.Context) error { <-ctx.Done(); return nil }

// Each function that takes a *Client fails with an error naming itself and
// the nil client, rather than panicking.
func TestRegisterNilClient(t *testing.T) {
	t.Parallel()
	reg := eventstore.NewRegistry()
	p := projection.New("reg.p", reg)
	o := projection.NewObserver("reg.o", reg)
	for what, call := range map[string]func() error{
		"AddProjection": func() error { return annals.AddProjection(nil, p, nil) },
		"AddObserver":   func() error { return annals.AddObserver(nil, o, nil) },
		"AddSaga":       func() error { return annals.AddSaga(nil, saga.New[struct{}]("reg.s", reg), nil) },
		"AddTask":       func() error { return annals.AddTask(nil, scheduler.Task{Name: "reg.t"}) },
		"AddService":    func() error { return annals.AddService(nil, "reg.svc", regService{}) },
		"NewRepository": func() error {
			_, err := annals.NewRepository(nil, "account", func() *regAccount { return &regAccount{} }, nil)
			return err
		},
	} {
		err := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s(nil client) panicked: %v", what, r)
				}
			}()
			return call()
		}()
		if err == nil || !strings.Contains(err.Error(), what+" with a nil *Client") {
			t.Errorf("%s(nil client) = %v, want an error naming the nil *Client", what, err)
		}
	}
}
