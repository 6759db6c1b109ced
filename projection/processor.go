package projection

import (
	"fmt"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/catchup"
)

// RegisterProcessor adds a subscriber whose batches a catchup.Processor of
// the caller's handles (package relay's publisher is one), for machinery
// that needs the runner's leader election, standbys, fencing, instance
// registry and metrics but not its handler dispatch. newProc makes one
// processor per subscriber partition. Of opts only Types, Partitions,
// BatchSize and Kind apply: retries, dead letters and checkpoints are the
// processor's (it commits through the catchup.Lease).
func (r *Runner) RegisterProcessor(name string, newProc func() catchup.Processor, opts *Options) error {
	if name == "" {
		return errors.New("projection: RegisterProcessor with an empty name")
	}
	if err := checkName(name); err != nil {
		return err
	}
	if newProc == nil {
		return errors.Newf("projection: %q: RegisterProcessor without a processor", name)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if err := nonNegative(fmt.Sprintf("projection: %q", name), opt("Options.Partitions", o.Partitions),
		opt("Options.BatchSize", o.BatchSize)); err != nil {
		return err
	}
	if o.Partitions == 0 {
		o.Partitions = 1
	}
	if o.Partitions > 1024 {
		return errors.Newf("projection: %q: %d partitions; at most 1024", name, o.Partitions)
	}
	filter, err := catchup.ParseFilter(o.Types)
	if err != nil {
		return errors.Wrapf(err, "projection: %q", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running {
		return errors.New("projection: RegisterProcessor after Run started")
	}
	kind := o.Kind
	if kind == "" {
		kind = "processor"
	}
	if err := r.registeredTwice(kind, name); err != nil {
		return err
	}
	r.names[name] = true
	r.regs = append(r.regs, &registration{name: name, kind: kind, opts: o, filter: filter, newProc: newProc})
	return nil
}
