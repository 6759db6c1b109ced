package advisorylock

import "github.com/annals-dev/annals/internal/lockkey"

// Key returns the advisory-lock key of s: the first eight bytes of md5(s) as
// two int4 halves, the arguments of pg_try_advisory_lock(k1, k2) and
// pg_advisory_unlock(k1, k2). SQL computes the same pair with
//
//	SELECT ('x' || substr(md5(s), 1, 8))::bit(32)::int4,
//	       ('x' || substr(md5(s), 9, 8))::bit(32)::int4;
//
// when the database encoding is UTF8 (md5 hashes the text in the database
// encoding; Go hashes the string's bytes), so SQL and other languages can
// take, test or look up (pg_locks: classid = k1, objid = k2 as unsigned
// 32-bit numbers, objsubid = 2) the lock of a Go process.
func Key(s string) (int32, int32) { return lockkey.Pair(s) }
