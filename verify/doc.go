// Package verify checks an annals log for what appends through annals'
// functions can never produce, and for rows changed since an earlier run.
//
// Roles granted by migrations.Grant cannot write the log except through the
// append functions. The schema's owner and superusers still can: they can
// switch the append-only trigger off (ALTER TABLE ... DISABLE TRIGGER,
// session_replication_role) and insert, update or delete rows, and they
// could recompute any digest kept in the database. [Log] is how such a
// change is found: it reads the whole log from one snapshot and reports
//
//   - a stream whose versions have a gap, a duplicate, or go down as the
//     position goes up (a row deleted, or inserted out of order); a
//     deleted stream or one with retention may start above version 1;
//   - a streams row that disagrees with the stream's events (for a deleted
//     stream or one with retention, whose oldest or newest events the
//     scavenger may have removed, only a highest event above its version);
//   - a position above the last one the position sequence handed out (a row
//     not appended through the function: subscribers would jump past every
//     event below it);
//   - a position held by a row of events and one of events_archive (archive
//     moves rows; the pages read by position would show one copy only);
//   - a maximum count or age in streams that the latest "$stream.truncated"
//     event of the stream's metadata stream does not record
//     (set_stream_retention writes both): unless the stream is also
//     truncated or deleted, it excuses no missing event then (a metadata
//     stream with retention of its own, or truncated or deleted, may have
//     lost the record: such a stream is not checked);
//   - with a [Baseline] from an earlier run, every range of positions whose
//     rows differ from it (any column of any row changed, a row deleted or
//     inserted).
//
// A baseline is a running SHA-256 over the rows in position order, with a
// checkpoint (position, digest of the range, running digest) every
// Config.Interval events; a later run hashes the same ranges and compares.
// It costs nothing at write time and is only as trustworthy as the place it
// is kept: store it outside the database, out of the owner's reach.
package verify
