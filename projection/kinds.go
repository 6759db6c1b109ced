package projection

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/internal/pgtx"
)

//go:embed kinds.sql
var kindsSQL string

// KindTail is the kind `annals tail --subscriber` runs its observer as (its
// SubscriberKind): a subscriber that only prints what it reads. The runner
// starts no subscriber of this kind under a name recorded as another kind,
// and no other kind under a tail's name whose checkpoints the tail moved
// (see [SubscriberKindError]).
const KindTail = "tail"

// ErrSubscriberKind is matched (errors.Is) by the error of a runner start
// refused because a subscriber's name is recorded, in the database, as the
// name of another kind of subscriber whose checkpoints it would share: a
// *SubscriberKindError.
var ErrSubscriberKind = errors.New("projection: the subscriber's name is recorded as another kind's")

// SubscriberKindError says why a runner refused to start: subscriber
// Subscriber, registered as Kind, is recorded as Recorded's (the kind of
// the last runner that ran it). A subscriber keeps its position in the
// checkpoints of its name, so two kinds of subscriber under one name share
// one position, and each skips, for good, the events the other handled.
//
// The runner refuses two cases and takes the name over, recording its own
// kind, in every other:
//
//   - a tail (KindTail) under a handler's name: leading it, the tail would
//     move the handler's checkpoint, and the handler would skip every event
//     the tail printed. Give the tail a name of its own.
//   - a handler under the name of a tail that moved its checkpoints (Moved):
//     the handler would start where the tail stopped, not at the beginning
//     of the log, and never handle the events before. Run it under another
//     name, or set the tail's checkpoints back to 0 first ('annals
//     checkpoint set NAME 0' for each partition), and it takes the name
//     over.
//
// A handler started as another handler kind (an observer rewritten as a
// projection, a processor as a saga) is the same subscriber redeployed: it
// resumes from its checkpoint, and the runner records its new kind with a
// warning. A tail's name whose checkpoints are all at 0 (the tail printed
// nothing) is taken over silently. A name recorded as no kind (NULL: run
// only by runners older than migration 0044) is taken by any.
type SubscriberKindError struct {
	// Subscriber is the subscriber's name.
	Subscriber string
	// Kind is the kind it was registered as now.
	Kind string
	// Recorded is the kind the database records for it.
	Recorded string
	// Moved reports whether any of its checkpoints is past 0.
	Moved bool
}

// Error implements error.
func (e *SubscriberKindError) Error() string {
	if e.Kind == KindTail {
		return fmt.Sprintf("projection: subscriber %q is %s %s's: a tail of that name would share its checkpoint, "+
			"and the %s would skip, for good, every event the tail printed while leading it; give the tail a name of its own",
			e.Subscriber, article(e.Recorded), e.Recorded, e.Recorded)
	}
	return fmt.Sprintf("projection: %s %q: the name is a tail's, whose checkpoint is past the beginning of the log: "+
		"the %s would start where the tail stopped and never handle the events before; "+
		"run it under another name, or set the tail's checkpoints back to 0 first ('annals checkpoint set %s 0', each --partition)",
		e.Kind, e.Subscriber, e.Kind, e.Subscriber)
}

// Is reports whether target is ErrSubscriberKind.
func (e *SubscriberKindError) Is(target error) bool { return target == ErrSubscriberKind }

// article is "an" before a kind that starts with a vowel, "a" otherwise.
func article(kind string) string {
	if kind != "" && (kind[0] == 'a' || kind[0] == 'e' || kind[0] == 'i' || kind[0] == 'o' || kind[0] == 'u') {
		return "an"
	}
	return "a"
}

// judgeKind decides whether a subscriber registered as kind may run under
// name, recorded as recorded ("" for none) with checkpoints moved past 0
// or not: nil, or a *SubscriberKindError. See SubscriberKindError.
func judgeKind(name, kind, recorded string, moved bool) error {
	switch {
	case recorded == "" || recorded == kind:
		return nil
	case kind == KindTail, recorded == KindTail && moved:
		return errors.WithStack(&SubscriberKindError{Subscriber: name, Kind: kind, Recorded: recorded, Moved: moved})
	}
	return nil
}

// kindsUnreadable reports whether err is the refusal of a schema migrated
// before 0044 (no kind column: 42703, undefined_column) or of a role that
// may not read or update subscriber_layouts (42501; CheckLayout, which
// runs next, says what grant mends it): the runner records no kind then,
// and runs as a runner before 0044 did.
func kindsUnreadable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42703" || pgErr.Code == "42501")
}

// kindRegs returns the name and kind of each registration whose subscriber
// is its name (a blue/green read model's generations run as <name>#g<N>,
// whose kind is not recorded: their read_model_generations rows say whose
// they are).
func (r *Runner) kindRegs() [][2]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var regs [][2]string
	for _, reg := range r.regs {
		if reg.bg == nil {
			regs = append(regs, [2]string{reg.name, reg.kind})
		}
	}
	return regs
}

// checkKinds refuses, before anything of the start is done, a subscriber
// whose name is recorded as another kind's that judgeKind refuses.
func (r *Runner) checkKinds(ctx context.Context) error {
	for _, reg := range r.kindRegs() {
		recorded, moved, err := r.recordedKind(ctx, reg[0])
		if kindsUnreadable(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := judgeKind(reg[0], reg[1], recorded, moved); err != nil {
			return err
		}
	}
	return nil
}

// recordKinds records each subscriber's kind, once its partition layout is
// recorded (CheckLayout: the row the kind is recorded in), judging again a
// kind another process recorded since checkKinds.
func (r *Runner) recordKinds(ctx context.Context) error {
	for _, reg := range r.kindRegs() {
		name, kind := reg[0], reg[1]
		for attempt := 0; attempt < 3; attempt++ {
			recorded, moved, err := r.recordedKind(ctx, name)
			if kindsUnreadable(err) {
				return nil
			}
			if err != nil {
				return err
			}
			if err := judgeKind(name, kind, recorded, moved); err != nil {
				return err
			}
			if recorded == kind {
				break
			}
			var done bool
			err = r.pool.QueryRow(ctx, r.q["RecordKind"], name, kind, recorded).Scan(&done)
			if errors.Is(err, pgx.ErrNoRows) || pgtx.Retryable(err) {
				// Recorded by another process since, or no layout row to
				// record it in. Under a REPEATABLE READ or SERIALIZABLE
				// default the UPDATE of a row another process changed after
				// its snapshot fails to serialize instead (40001): read the
				// kind again all the same, in a new statement and snapshot.
				continue
			}
			if kindsUnreadable(err) {
				return nil
			}
			if err != nil {
				return errors.Wrapf(err, "projection: record the kind of subscriber %q", name)
			}
			if recorded != "" && recorded != KindTail {
				r.cfg.Logger.WarnContext(ctx, "annals: a subscriber recorded as another kind now runs as this one; it resumes from its checkpoint",
					slog.String("subscriber", name), slog.String("recorded_kind", recorded), slog.String("kind", kind))
			}
			break
		}
	}
	return nil
}

// recordedKind returns the kind recorded for subscriber name ("" for none)
// and whether any of its checkpoints moved past 0.
func (r *Runner) recordedKind(ctx context.Context, name string) (kind string, moved bool, err error) {
	err = r.pool.QueryRow(ctx, r.q["RecordedKind"], name).Scan(&kind, &moved)
	if err != nil && !kindsUnreadable(err) {
		err = errors.Wrapf(err, "projection: read the kind recorded for subscriber %q", name)
	}
	return kind, moved, err
}
