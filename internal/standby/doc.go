// Package standby reads the physical standbys streaming from a PostgreSQL
// server (pg_stat_replication), with how far behind each has replayed, for
// `annals status` and the operator console, which show them alike.
//
// Logical walsenders (annals' WAL sources, the relay's --wal) stream from
// a logical slot and are no standbys: they are left out. A role without
// pg_read_all_stats sees a walsender's PID and no details: PostgreSQL
// hides them, and Standby.Hidden says so.
package standby
