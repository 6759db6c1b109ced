package projection

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"

	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/internal/ratelog"
	"github.com/annals-dev/annals/internal/telemetry"
)

// blueGreenServiceName is the service that runs the generations of a
// runner's blue/green projections.
const blueGreenServiceName = "annals.bluegreen"

// newBlueGreenReg checks a blue/green registration.
func newBlueGreenReg(name string, handler any, cfg *BlueGreen) (*blueGreenReg, error) {
	p, ok := handler.(Projection)
	if !ok {
		return nil, errors.Newf("projection: %q: BlueGreen is for projections (an observer has no read model)", name)
	}
	c := cfg.withDefaults()
	if c.Version < 1 {
		return nil, errors.Newf("projection: %q: BlueGreen.Version %d; want at least 1", name, c.Version)
	}
	if err := validateReaderSchema(c.ReaderSchema); err != nil {
		return nil, errors.Wrapf(err, "projection: %q: BlueGreen.ReaderSchema", name)
	}
	s, ok := p.(Setupper)
	if !ok || s.SetupVersion() <= 0 {
		return nil, errors.Newf("projection: %q: a blue/green read model needs a setup that creates its tables (OnSetup, or implement Setupper)", name)
	}
	cut, _ := p.(CommitCutter)
	return &blueGreenReg{cfg: c, p: p, setup: s, cut: cut}, nil
}

func validateReaderSchema(s string) error {
	if s == "" || len(s) > 63 {
		return errors.Newf("%q: want 1 to 63 bytes", s)
	}
	return nil
}

// blueGreenService runs, in every runner process, the generations of the
// blue/green projections whose version is this code's: the live one, and
// one being built (beside the live one, under its own subscriber). Every
// CheckInterval it creates what the version needs (ensureGenerations),
// starts and stops generations as their states change, tries the cut-over
// of a building generation that has caught up, logs its progress, and
// drops retired generations whose retention has passed.
type blueGreenService struct {
	r *Runner
	// waits is, per building generation's subscriber whose cut-over waits
	// for dead letters, the count last logged and when.
	waits map[string]loggedWait
}

type loggedWait struct {
	n  int
	at time.Time
}

// running is one generation this process runs.
type running struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (s *blueGreenService) Run(ctx context.Context) error {
	r := s.r
	g, err := newGenerations(r.cfg.Schema)
	if err != nil {
		return err
	}
	listener, err := catchup.NewPoolListener(r.pool, r.cfg.Schema, r.cfg.Logger)
	if err != nil {
		return err
	}
	engine, err := r.newEngine(listener)
	if err != nil {
		return err
	}
	lctx, stopListener := context.WithCancel(context.WithoutCancel(ctx))
	ldone := make(chan struct{})
	go func() { defer close(ldone); _ = listener.Run(lctx) }()
	runs := map[string]*running{} // by generation subscriber
	defer func() {
		for _, x := range runs {
			x.cancel()
		}
		for _, x := range runs {
			<-x.done
		}
		stopListener()
		<-ldone
	}()
	r.mu.Lock()
	var regs []*registration
	interval := time.Duration(0)
	for _, reg := range r.regs {
		if reg.bg != nil {
			regs = append(regs, reg)
			if interval == 0 || reg.bg.cfg.CheckInterval < interval {
				interval = reg.bg.cfg.CheckInterval
			}
		}
	}
	r.mu.Unlock()
	lastLog := map[string]time.Time{}
	s.waits = map[string]loggedWait{}
	// failing is, per projection whose rounds fail, the run of failed
	// rounds: a failure that lasts (a grant taken away, a row the rounds
	// refuse) is a WARN at most once a minute while its error stays the
	// same, not one every CheckInterval.
	failing := map[string]*ratelog.Run{}
	for {
		for _, reg := range regs {
			err := s.check(ctx, engine, g, reg, runs, lastLog)
			if ctx.Err() != nil {
				break
			}
			f := failing[reg.name]
			if err == nil {
				if f != nil {
					delete(failing, reg.name)
					n, lasted, _ := f.Recovered()
					r.cfg.Logger.InfoContext(ctx, "annals: blue/green checks work again", slog.String("projection", reg.name),
						slog.Int("failed_rounds", n), slog.Duration("failed_for", lasted.Round(time.Millisecond)))
				}
				continue
			}
			if f == nil {
				f = &ratelog.Run{Every: bgCheckWarnEvery}
				failing[reg.name] = f
			}
			if f.FailedWith(err.Error()) == slog.LevelWarn {
				r.cfg.Logger.WarnContext(ctx, "annals: blue/green check failed", slog.String("projection", reg.name),
					slog.Int("failed_rounds", f.Count()), slog.Duration("failing_for", f.For().Round(time.Millisecond)), telemetry.Err(err))
				continue
			}
			r.cfg.Logger.DebugContext(ctx, "annals: blue/green check failed (the same failure was warned of within the minute)",
				slog.String("projection", reg.name), slog.Int("failed_rounds", f.Count()), telemetry.Err(err))
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// bgCheckWarnEvery is how often a blue/green round that keeps failing the
// same way is logged at WARN (the rounds between log at DEBUG; a round
// that fails another way is a WARN at once).
const bgCheckWarnEvery = time.Minute

// check does one round for one projection.
func (s *blueGreenService) check(ctx context.Context, engine *catchup.Engine, g *generations, reg *registration, runs map[string]*running, lastLog map[string]time.Time) error {
	r, bg := s.r, reg.bg
	gens, err := r.ensureGenerations(ctx, g, reg.name, bg)
	if err != nil {
		return err
	}
	// The generations of this version to run, in generation order; a row
	// naming what annals does not give its generation is left out (and
	// logged, at most once a minute), whatever the others' rows say. One
	// changed so after its generation started here does not stop it: what
	// runs was checked when it started, and keeps the schema it had.
	var want []Generation
	ofVersion := 0
	keep := map[string]bool{} // running, its row refused since
	var liveRefused error
	for _, x := range gens {
		if x.Version != bg.cfg.Version || (x.State != GenerationBuilding && x.State != GenerationLive) {
			continue
		}
		ofVersion++
		if err := x.forged(g.schema, reg.name); err != nil {
			switch {
			case runs[x.Subscriber] != nil:
				keep[x.Subscriber] = true
			case x.State == GenerationLive:
				liveRefused = err
			}
			s.skipRefused(ctx, g, reg.name, x, err, lastLog)
			continue
		}
		want = append(want, x)
	}
	wanted := func(sub string) bool {
		return keep[sub] || slices.ContainsFunc(want, func(x Generation) bool { return x.Subscriber == sub })
	}
	if key := "idle:" + reg.name; ofVersion == 0 && time.Since(lastLog[key]) >= time.Minute {
		// This process runs nothing of the read model: say so, and why (an
		// operator rolling out a new version may not know that instances of
		// the old one must keep running meanwhile).
		lastLog[key] = time.Now()
		why := "no generation of this version is live or being built"
		if l := live(gens); l != nil {
			switch {
			case l.Version < bg.cfg.Version && !bg.cfg.AutoRebuild:
				why = fmt.Sprintf("the live generation is version %d, and BlueGreen.AutoRebuild is off: nothing builds version %d until "+
					"Runner.RebuildBlueGreen (projections rebuild %s) runs; instances of version %d must serve it meanwhile",
					l.Version, bg.cfg.Version, reg.name, l.Version)
			case l.Version < bg.cfg.Version:
				// Say what the registry records: a rollback, a newer version
				// being built, or (in between) a generation about to be set up.
				why = fmt.Sprintf("a generation of version %d is to be set up (BlueGreen.AutoRebuild); the live generation is version %d",
					bg.cfg.Version, l.Version)
				if blocker, ok := rebuildBlocker(gens, bg.cfg.Version); ok {
					why = fmt.Sprintf("%s: BlueGreen.AutoRebuild does not build version %d by itself (projections rebuild %s "+
						"does); the live generation is version %d", blocker, bg.cfg.Version, reg.name, l.Version)
				}
			case l.Version > bg.cfg.Version:
				why = fmt.Sprintf("the live generation is version %d, newer than this runner's: a cut-over never moves readers "+
					"back a version (a building generation of this version is retired)", l.Version)
			}
		}
		r.cfg.Logger.WarnContext(ctx, "annals: this runner runs no generation of the blue/green read model",
			slog.String("projection", reg.name), slog.Int("version", bg.cfg.Version), slog.String("why", why))
	}
	for sub, x := range runs {
		if wanted(sub) {
			continue
		}
		if _, mine := generationOf(gens, sub); !mine {
			continue // another projection's
		}
		x.cancel()
		<-x.done
		delete(runs, sub)
		r.cfg.Logger.InfoContext(ctx, "annals: stopped running a read-model generation", slog.String("subscriber", sub))
	}
	for _, gen := range want {
		sub := gen.Subscriber
		if runs[sub] != nil {
			continue
		}
		subs, err := r.generationSubs(ctx, reg, g, gen, nil)
		if refusedGeneration(err) {
			if gen.State == GenerationLive {
				liveRefused = err
			}
			s.skipRefused(ctx, g, reg.name, gen, err, lastLog)
			continue
		}
		if err != nil {
			return err
		}
		gctx, cancel := context.WithCancel(ctx)
		x := &running{cancel: cancel, done: make(chan struct{})}
		runs[sub] = x
		var wg sync.WaitGroup
		for _, sc := range subs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := engine.Run(gctx, sc); err != nil {
					err = layoutAdvice(err, reg, gen)
					r.cfg.Logger.ErrorContext(gctx, "annals: subscription ended", slog.String("subscriber", sc.Name), telemetry.Err(err))
				}
			}()
		}
		go func() { wg.Wait(); close(x.done) }()
		r.cfg.Logger.InfoContext(ctx, "annals: running a read-model generation", slog.String("projection", reg.name),
			slog.Int("generation", gen.Generation), slog.String("state", string(gen.State)), slog.String("schema", gen.Schema))
	}
	if liveRefused != nil {
		// The live generation's own row is refused (and it does not run
		// here yet): the read model cannot run here; the other generations
		// of its version run meanwhile, and nothing is cut over.
		return liveRefused
	}
	// A building generation that has caught up with the live one: cut over.
	old := live(gens)
	for _, gen := range want {
		if gen.State != GenerationBuilding || runs[gen.Subscriber] == nil {
			continue // or refused (skipRefused)
		}
		lo, _, n, err := g.positions(ctx, r.pool, gen.Subscriber, false)
		if err != nil {
			return err
		}
		var target int64
		if old != nil {
			if _, target, _, err = g.positions(ctx, r.pool, old.Subscriber, false); err != nil {
				return err
			}
		}
		if gen.Unresolved > 0 {
			// Not cut over while it lacks events: say why, when the count
			// changes and every minute (an operator has to act).
			w, err := g.unresolved(ctx, r.pool, gen.Subscriber)
			if err != nil {
				return err
			}
			if w.n > 0 {
				s.logWait(ctx, reg.name, gen, w, lo, target)
				continue
			}
		}
		if _, waited := s.waits[gen.Subscriber]; waited {
			delete(s.waits, gen.Subscriber)
			r.cfg.Logger.InfoContext(ctx, "annals: blue/green cut-over: the dead letters of the new generation are resolved",
				slog.String("projection", reg.name), slog.Int("generation", gen.Generation))
		}
		if n < reg.opts.Partitions || lo < target {
			if time.Since(lastLog[gen.Subscriber]) >= 10*time.Second {
				lastLog[gen.Subscriber] = time.Now()
				r.cfg.Logger.InfoContext(ctx, "annals: blue/green rebuild in progress", slog.String("projection", reg.name),
					slog.Int("generation", gen.Generation), slog.Int64("position", lo), slog.Int64("live_position", target))
			}
			continue
		}
		// A newer version gone live meanwhile makes it retired, not live
		// (logged by cutover); the next round stops running it.
		if _, err := r.cutover(ctx, g, reg.name, bg, gen.Generation, reg.opts.Partitions,
			waitFor(g, gen.Subscriber)); err != nil &&
			!errors.Is(err, ErrCutoverBehind) && !errors.Is(err, ErrCutoverDeadLetters) && !errors.Is(err, ErrCutoverOlderVersion) {
			return err
		}
	}
	// The janitor: at most once a minute per projection and process.
	if key := "janitor:" + reg.name; bg.cfg.Retention >= 0 && time.Since(lastLog[key]) >= time.Minute {
		lastLog[key] = time.Now()
		dropped, err := DropRetired(ctx, r.pool, r.cfg.Schema, reg.name, bg.cfg.Retention)
		if len(dropped) > 0 {
			r.cfg.Logger.InfoContext(ctx, "annals: dropped retired read-model generations", slog.String("projection", reg.name),
				slog.Any("generations", dropped), slog.Duration("retention", bg.cfg.Retention))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// refusedGeneration reports whether err refuses a generation's row
// (ErrForgedGeneration, ErrForeignGenerationSchema): the row, which any
// runner role may write, is at fault, not the database.
func refusedGeneration(err error) bool {
	return errors.Is(err, ErrForgedGeneration) || errors.Is(err, ErrForeignGenerationSchema)
}

// skipRefused logs, at most once a minute per row, that generation gen of
// the read model name is not started because its row is refused (err,
// from forged or generationSubs): the generations beside it run.
func (s *blueGreenService) skipRefused(ctx context.Context, g *generations, name string, gen Generation, err error, lastLog map[string]time.Time) {
	key := fmt.Sprintf("refused:%s:%d", name, gen.Generation)
	if time.Since(lastLog[key]) < time.Minute {
		return
	}
	lastLog[key] = time.Now()
	s.r.warnRefused(ctx, g, name, gen, err)
}

// warnRefused logs that generation gen of the read model name is skipped
// because its row is refused (err): the row, why, and the roles that could
// have written it.
func (r *Runner) warnRefused(ctx context.Context, g *generations, name string, gen Generation, err error) {
	var writers string
	if qerr := r.pool.QueryRow(ctx, g.q["GenerationWriters"], g.schema).Scan(&writers); qerr != nil {
		writers = "unknown (" + qerr.Error() + ")"
	}
	r.cfg.Logger.WarnContext(ctx, "annals: blue/green: a generation's row is refused and skipped (nothing is started from it); the other generations run",
		slog.String("projection", name), slog.Int("generation", gen.Generation), slog.Int("version", gen.Version),
		slog.String("state", string(gen.State)), slog.String("schema", gen.Schema), slog.String("subscriber", gen.Subscriber),
		slog.String("created_by", gen.CreatedBy), slog.String("why", err.Error()),
		slog.String("written_by_one_of", writers+" (roles that may insert or update read_model_generations, and their members; superusers)"))
}

// runnable returns, with their subscriptions and in generation order, the
// generations of gens of reg's version (live or building) that this runner
// may run. A refused row (refusedGeneration) is left out and passed to
// skipped, unless it is the live generation's, or no generation of the
// version is left to run: then its refusal is returned (the read model
// cannot run here).
func (r *Runner) runnable(ctx context.Context, reg *registration, g *generations, gens []Generation, skipped func(Generation, error)) ([]Generation, [][]*catchup.Subscription, error) {
	var (
		out     []Generation
		subs    [][]*catchup.Subscription
		refused error
	)
	for _, gen := range gens {
		if gen.Version != reg.bg.cfg.Version || (gen.State != GenerationBuilding && gen.State != GenerationLive) {
			continue
		}
		s, err := r.generationSubs(ctx, reg, g, gen, nil)
		if refusedGeneration(err) {
			if gen.State == GenerationLive {
				return nil, nil, err
			}
			if refused == nil {
				refused = err
			}
			if skipped != nil {
				skipped(gen, err)
			}
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		out, subs = append(out, gen), append(subs, s)
	}
	if len(out) == 0 && refused != nil {
		return nil, nil, refused
	}
	return out, subs, nil
}

// logWait logs that the cut-over of gen waits for its dead letters w: at
// once, when their number changes, and every minute.
func (s *blueGreenService) logWait(ctx context.Context, name string, gen Generation, w deadLetterWait, pos, livePos int64) {
	last, logged := s.waits[gen.Subscriber]
	if logged && last.n == w.n && time.Since(last.at) < time.Minute {
		return
	}
	s.waits[gen.Subscriber] = loggedWait{n: w.n, at: time.Now()}
	s.r.cfg.Logger.WarnContext(ctx, "annals: blue/green cut-over waits: the new generation has unresolved dead letters",
		slog.String("projection", name), slog.Int("generation", gen.Generation), slog.String("subscriber", gen.Subscriber),
		slog.Int("unresolved", w.n), slog.Int("released", w.released), slog.Int64("first_position", w.first),
		slog.Int64("position", pos), slog.Int64("live_position", livePos), slog.String("why", w.String()))
}

func generationOf(gens []Generation, sub string) (Generation, bool) {
	i := slices.IndexFunc(gens, func(x Generation) bool { return x.Subscriber == sub })
	if i < 0 {
		return Generation{}, false
	}
	return gens[i], true
}

// catchUpBlueGreen is RunUntilCaughtUp for the blue/green projections: it
// creates what their versions need, catches their live and building
// generations of this version up to head, and tries the cut-over of a
// building one once.
func (r *Runner) catchUpBlueGreen(ctx context.Context, engine *catchup.Engine, head int64) error {
	r.mu.Lock()
	regs := slices.Clone(r.regs)
	r.mu.Unlock()
	g, err := newGenerations(r.cfg.Schema)
	if err != nil {
		return err
	}
	for _, reg := range regs {
		if reg.bg == nil {
			continue
		}
		gens, err := r.ensureGenerations(ctx, g, reg.name, reg.bg)
		if err != nil {
			return err
		}
		run, subs, err := r.runnable(ctx, reg, g, gens, func(gen Generation, err error) { r.warnRefused(ctx, g, reg.name, gen, err) })
		if err != nil {
			return err
		}
		for i, gen := range run {
			for _, s := range subs[i] {
				if err := r.catchUp(ctx, engine, s, head); err != nil {
					return err
				}
			}
			if gen.State == GenerationBuilding {
				_, err := r.cutover(ctx, g, reg.name, reg.bg, gen.Generation, reg.opts.Partitions,
					waitFor(g, gen.Subscriber))
				if errors.Is(err, ErrCutoverDeadLetters) {
					r.cfg.Logger.WarnContext(ctx, "annals: blue/green cut-over waits", slog.String("projection", reg.name),
						slog.Int("generation", gen.Generation), telemetry.Err(err))
					continue
				}
				if err != nil && !errors.Is(err, ErrCutoverBehind) && !errors.Is(err, ErrCutoverOlderVersion) {
					return err
				}
			}
		}
	}
	return nil
}

// checkBlueGreenLayouts refuses, before anything starts, a blue/green
// projection whose generations of the registered version (live or
// building) were built with another partition layout than its Options
// say: with a *catchup.PartitionLayoutError (catchup.ErrPartitionLayout)
// that says how to change the layout (a new BlueGreen.Version). A
// generation without a recorded layout gets this one.
func (r *Runner) checkBlueGreenLayouts(ctx context.Context, engine *catchup.Engine) error {
	r.mu.Lock()
	regs := slices.Clone(r.regs)
	r.mu.Unlock()
	var g *generations
	for _, reg := range regs {
		if reg.bg == nil {
			continue
		}
		if g == nil {
			var err error
			if g, err = newGenerations(r.cfg.Schema); err != nil {
				return err
			}
		}
		if err := r.checkGenerationLayouts(ctx, engine, g, reg); err != nil {
			return err
		}
	}
	return nil
}

// checkGenerationLayouts is checkBlueGreenLayouts for one blue/green
// registration.
func (r *Runner) checkGenerationLayouts(ctx context.Context, engine *catchup.Engine, g *generations, reg *registration) error {
	gens, err := g.list(ctx, r.pool, reg.name)
	if err != nil {
		return err
	}
	// A refused row is skipped here (the runner's rounds and
	// RunUntilCaughtUp log it), unless it is the live generation's or
	// nothing of this version is left to run.
	run, subs, err := r.runnable(ctx, reg, g, gens, nil)
	if err != nil {
		return err
	}
	for i, gen := range run {
		for _, sc := range subs[i] {
			if err := engine.CheckLayout(ctx, sc); err != nil {
				return layoutAdvice(err, reg, gen)
			}
		}
	}
	return nil
}

// layoutAdvice replaces a generation's catchup.ErrPartitionLayout by one
// that says how a blue/green read model changes its layout (a new
// BlueGreen.Version; not a rebuild's NewLayout, which the catch-up error
// suggests), still matching it (errors.Is, errors.As); other errors pass
// unchanged.
func layoutAdvice(err error, reg *registration, gen Generation) error {
	if !errors.Is(err, catchup.ErrPartitionLayout) {
		return err
	}
	remedy := fmt.Sprintf("a generation keeps the partition layout it was built with: to change Partitions or PartitionBy, "+
		"raise BlueGreen.Version (to %d): a new generation is built with the new layout beside the live one and cut over; "+
		"until then, run this version with the layout it was built with", gen.Version+1)
	var le *catchup.PartitionLayoutError
	if !errors.As(err, &le) {
		return errors.Wrapf(err, "projection: %q: generation %d of the blue/green read model (version %d): %s",
			reg.name, gen.Generation, gen.Version, remedy)
	}
	var was string
	switch {
	case le.RecordedPartitions > 0:
		was = "was built with " + layoutText(le.RecordedPartitions, le.RecordedPartitionBy)
	case le.Checkpoints == le.HighestPartition+1:
		was = fmt.Sprintf("has checkpoints for partitions 0-%d, so it was built with %s", le.HighestPartition,
			layoutText(le.HighestPartition+1, ""))
	default:
		was = fmt.Sprintf("has a checkpoint for partition %d, so it was built with more than %s", le.HighestPartition,
			layoutText(le.Partitions, ""))
	}
	return &blueGreenLayoutError{err: err, msg: fmt.Sprintf("projection: %q: generation %d of the blue/green read model "+
		"(version %d, subscriber %q) %s; asked for %s now; %s", reg.name, gen.Generation, gen.Version, le.Subscriber, was,
		layoutText(le.Partitions, le.PartitionBy), remedy)}
}

// blueGreenLayoutError is a generation's catchup.ErrPartitionLayout with
// the blue/green advice in place of the catch-up error's message.
type blueGreenLayoutError struct {
	err error // matches catchup.ErrPartitionLayout
	msg string
}

func (e *blueGreenLayoutError) Error() string { return e.msg }
func (e *blueGreenLayoutError) Unwrap() error { return e.err }

// layoutText describes a partition layout as catchup's errors do.
func layoutText(partitions int, by string) string {
	switch {
	case partitions <= 1:
		return "1 partition"
	case by == "" || by == catchup.PartitionByStream:
		return fmt.Sprintf("%d partitions", partitions)
	}
	return fmt.Sprintf("%d partitions by %s", partitions, by)
}

// hasBlueGreen reports whether a blue/green projection is registered.
func (r *Runner) hasBlueGreen() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.ContainsFunc(r.regs, func(reg *registration) bool { return reg.bg != nil })
}

// waitFor is the cut-over's catch-up for a generation that its leaders run
// live (here or elsewhere): it waits until every partition of subscriber
// sub has reached target (the old generation is held there), polling on
// the cut-over's transaction, which needs no connection of the pool. ctx's
// deadline (the cut-over's) bounds the wait; each poll runs to its end
// rather than being cut off by it, which would close the transaction's
// connection.
func waitFor(g *generations, sub string) func(ctx context.Context, tx pgx.Tx, from, target int64) error {
	return func(ctx context.Context, tx pgx.Tx, _, target int64) error {
		for {
			lo, _, _, err := g.positions(context.WithoutCancel(ctx), tx, sub, false)
			if err != nil || lo >= target {
				return err
			}
			if err := sleepCtx(ctx, 5*time.Millisecond); err != nil { // polling a checkpoint another leader moves
				return errors.Wrapf(err, "%s is at %d, the live generation at %d", sub, lo, target)
			}
		}
	}
}

// observeGenerations reports leadership and lag of the generation
// subscribers (<name>#g<N>) this process leads, under their own subscriber
// names: a building generation's lag is its rebuild's progress. Called with
// r.mu held, from the metrics callback.
func (r *Runner) observeGenerations(o metric.Observer, now time.Time) {
	for k := range r.leading {
		if !strings.Contains(k.sub, "#g") || r.names[k.sub] {
			continue
		}
		attrs := metric.WithAttributes(telemetry.Subscriber.String(k.sub), telemetry.Partition.Int(k.part))
		o.ObserveInt64(r.tel.Leader, 1, attrs)
		p, known := r.progress[k]
		if !known {
			continue
		}
		o.ObserveInt64(r.tel.Lag, max(p.head-p.cursor, 0), attrs)
		age := 0.0
		if !p.oldest.IsZero() {
			age = max(now.Sub(p.oldest).Seconds(), 0)
		}
		o.ObserveFloat64(r.tel.LagTime, age, attrs)
	}
}
