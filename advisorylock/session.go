package advisorylock

import (
	"context"
	"slices"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
)

// This file lets a Standby keep what it takes: a process that leads many
// keys can hold all of them on its standby session (one connection for all
// its locks) instead of a connection per Lock. The session then is what
// fences nothing by itself: whoever uses it that way must fence its writes
// otherwise (package catchup fences checkpoints with an epoch).

// Take tries each of keys once, in one statement (in the order given; the
// keys must be distinct and non-empty), and keeps every lock it takes on the
// standby's session: the Standby stays usable, and the locks are held until
// Give, Close or the session's end. It returns the indexes in keys of the
// locks it took, ascending (none is not an error).
func (s *Standby) Take(ctx context.Context, keys []string) (won []int, err error) {
	if s.spent {
		return nil, errors.New("advisorylock: standby: Take after the session went to a Lock or was closed")
	}
	if len(keys) == 0 {
		return nil, nil
	}
	k1, k2, err := pairs(keys)
	if err != nil {
		return nil, err
	}
	var qerr error // the statement's
	defer func() { s.ran(qerr) }()
	rows, qerr := s.conn.Query(ctx, q.tryLocks, k1, k2, s.mark)
	if qerr != nil {
		return nil, errors.Wrap(qerr, "advisorylock: standby: take locks")
	}
	var i int64
	if _, qerr = pgx.ForEachRow(rows, []any{&i}, func() error { won = append(won, int(i)-1); return nil }); qerr != nil {
		return nil, errors.Wrap(qerr, "advisorylock: standby: take locks")
	}
	if slices.Contains(won, -1) {
		return nil, errors.WithStack(ErrPooledSession)
	}
	return won, nil
}

// Give releases keys held on the session (taken with Take) in one statement
// and, when the Config names a ReleaseChannel, announces each on it, so
// that standbys elsewhere poll at once. It returns how many of them the
// session held.
func (s *Standby) Give(ctx context.Context, keys []string) (int, error) {
	if s.spent {
		return 0, errors.New("advisorylock: standby: Give after the session went to a Lock or was closed")
	}
	if len(keys) == 0 {
		return 0, nil
	}
	k1, k2, err := pairs(keys)
	if err != nil {
		return 0, err
	}
	var n int
	defer func() { s.ran(err) }()
	if s.cfg.ReleaseChannel != "" {
		err = s.conn.QueryRow(ctx, giveNotify, k1, k2, keys, s.cfg.ReleaseChannel).Scan(&n)
	} else {
		err = s.conn.QueryRow(ctx, q.unlockAll, k1, k2).Scan(&n)
	}
	return n, errors.Wrap(err, "advisorylock: standby: give back locks")
}

// Do runs fn on the standby's connection (for statements that belong on
// the session, such as a look at pg_locks in the poll's round trip). fn
// must not close the connection, keep it, or leave a transaction open,
// nor leave it idle for FreezeTimeout. (Wait does not count what fn runs:
// it pings as if fn had run nothing.)
func (s *Standby) Do(ctx context.Context, fn func(conn *pgx.Conn) error) error {
	if s.spent {
		return errors.New("advisorylock: standby: Do after the session went to a Lock or was closed")
	}
	return fn(s.conn)
}

// giveNotify unlocks the keys ($1, $2) and announces each ($3) on the
// channel $4; the notices go out when the statement's transaction commits,
// after the unlocks.
const giveNotify = `SELECT count(*) FILTER (WHERE g.unlocked)
  FROM (SELECT pg_advisory_unlock(k.k1, k.k2) AS unlocked, pg_notify($4::text, k.key) AS announced
          FROM unnest($1::int4[], $2::int4[], $3::text[]) AS k(k1, k2, key)) g`

// pairs returns the two int4 halves of each key, checking that the keys are
// non-empty and distinct.
func pairs(keys []string) (k1, k2 []int32, err error) {
	k1, k2 = make([]int32, len(keys)), make([]int32, len(keys))
	for i, k := range keys {
		if k == "" {
			return nil, nil, errors.New("advisorylock: standby: a key is empty")
		}
		if slices.Contains(keys[:i], k) {
			return nil, nil, errors.Newf("advisorylock: standby: key %q given twice", k)
		}
		k1[i], k2[i] = Key(k)
	}
	return k1, k2, nil
}
