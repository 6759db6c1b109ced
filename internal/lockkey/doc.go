// Package lockkey derives PostgreSQL advisory-lock keys from strings.
//
// A key is the first eight bytes of md5(s), split into two int4 halves for the
// two-argument forms pg_advisory_lock(k1, k2) and pg_advisory_xact_lock(k1, k2).
// That gives a 64-bit key space (hashtext would give 32 bits) and the same
// pair can be computed in SQL by operators:
//
//	SELECT ('x' || substr(md5(s), 1, 8))::bit(32)::int4,
//	       ('x' || substr(md5(s), 9, 8))::bit(32)::int4;
package lockkey
