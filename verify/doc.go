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
//     position goes up (a row deleted, or inserted out of order), unless
//     the stream's recorded retention, truncation or deletion excuses the
//     missing versions and a scavenge run removed events at their
//     positions (scavenge() is the only way events leave the log; the
//     latter is checked when the role can read scavenge_runs). A deletion
//     or a maximum age excuses any version; a truncation the versions
//     below it; a maximum count the versions up to the stream's version
//     less the smallest count recorded in force while a scavenge run
//     removed events (any recorded count, when the runs cannot be read),
//     never the newest;
//   - a streams row that disagrees with the stream's events (for a stream
//     excused as above, whose oldest or newest events the scavenger may
//     have removed, only a highest event above its version);
//   - a position above the last one the position sequence handed out (a row
//     not appended through the function: subscribers would jump past every
//     event below it);
//   - a position held by a row of events and one of events_archive (archive
//     moves rows; the pages read by position would show one copy only);
//   - a maximum count or age in streams that the latest "$stream.truncated"
//     event of the stream's metadata stream does not record
//     (set_stream_retention writes both): it excuses no missing event then
//     (only when no record is kept and the metadata stream has lost events
//     to retention of its own, possible before migration 0024, is the
//     stream not checked, with a note);
//   - a truncate_before in streams above the stream's version + 1 (no
//     function sets it there), or above what the stream's
//     "$stream.truncated" records hold; since migration 0038 delete_stream
//     records each deletion there too (with "deleted" and "version"), in
//     the metadata stream the scavenger never empties. A deletion older
//     than that has no record: it explains truncate_before only if its
//     "$stream.deleted" event just below lies below the first deletion
//     record in the log (at or below deletions_recorded_after(), the head
//     when 0038 ran, while there is none), or is gone with every older
//     event, removed by a scavenge run there. Between that head and the
//     first record lie the deletions whose delete_stream call started
//     while 0038 was applied: the call ran the function as it was
//     (PL/pgSQL takes the body when the call starts), waited for the
//     migration at the append lock and committed after it without a
//     record, but ahead of every call that started after the commit (only
//     a call that had started and not yet asked for the lock at that
//     instant can land later, and is reported). Until a deletion is
//     recorded such a deletion cannot be told from one set by hand: it is
//     reported, and the message says so (deletions going on during an
//     upgrade are soon followed by a recorded one);
//   - a stream marked deleted in streams that its records contradict: a
//     deletion must be recorded at the stream's version, with its kind
//     (state 1 soft, 2 hard), a stream recorded hard-deleted must still
//     be hard-deleted at that version, and one recorded deleted softly is
//     deleted at that version or live (recreated by an append) above it;
//     a deletion without a record must be older than the records (as
//     above), and is listed in a note. Either way its truncate_before must be its version + 1 and,
//     while older events remain, its newest event the "$stream.deleted"
//     event (delete_stream writes both; the scavenger removes that event
//     only with every older one);
//   - a stream whose version in streams is below a version its records
//     show it reached (a recorded deletion's version, a recorded
//     truncate_before less one): appends would reuse its versions;
//   - a trigger or unique index the log relies on that is missing,
//     disabled (ALTER TABLE ... DISABLE TRIGGER, or ENABLE REPLICA
//     TRIGGER) or changed: the append-only trigger of events, the guard
//     of events_archive, and the unique indexes on positions, event IDs,
//     (stream, version) and stream IDs; and deletions_recorded_after()
//     returning a position at or above a deletion record (replaced to let
//     deletions pass by the old rules: they are held to the first record
//     instead), or dropped while schema_migrations records 0038; and
//     row-level security enabled on a table it reads (events,
//     events_archive, streams, scavenge_runs, schema_migrations), whose
//     policies can hide rows from the role running it while subscribers'
//     roles read them; and a trigger or rule on events, events_archive or
//     streams that annals did not create (a BEFORE INSERT row trigger can
//     rewrite each event as it is appended, which no row check or baseline
//     shows), or a table inheriting from one of them;
//   - a scavenge run that removed events with a clock more than
//     ScavengeClockTolerance later than its start (scavenge() took the
//     caller's clock before migration 0027; since, a run's clock is never
//     later than the server's): it removed events by an age measured from
//     the future, and which ones cannot be told;
//   - with a [Baseline] from an earlier run, every range of positions whose
//     rows differ from it (any column of any row changed, a row deleted or
//     inserted).
//
// A baseline is a running SHA-256 over the rows in position order, with a
// checkpoint (position, digest of the range, running digest) every
// Config.Interval events; a later run hashes the same ranges and compares.
// It costs nothing at write time and is only as trustworthy as the place it
// is kept: store it outside the database, out of the owner's reach.
//
// Without a baseline some changes cannot be told from legitimate ones: a
// forged "$stream.truncated" record or scavenge_runs row, the newest
// events of a stream removed with its version lowered to match, and the
// deletions older than migration 0038, which have no record: one whose
// every event the scavenger removed can be set back from hard to soft (and
// then recreated by an append), its version lowered, or a stream made to
// look like one (every event removed, in a range a scavenge run removed
// events from below the first deletion record). The report lists such
// streams in a note. The baseline covers event rows only, so it tells
// such a change only by the events it removed or added. The schema's
// functions are compared with what the migrations make (functions.json:
// the body with the schema's name taken out, SECURITY DEFINER, settings,
// strictness, volatility) when the schema is at the migration this package
// knows, and any that is missing or differs, or a function of one of their
// names with another signature (an overload the server may pick for the
// eventstore's calls), is a [GuardRemoved], except the bodies that builds
// of annals made from a migration edited in place afterwards (historic in
// functions.go: Up never applies a migration again, so they stay through
// upgrades). At another migration, or without schema_migrations (the SQL
// of annals migrate --print applied by another tool) or SELECT on it, a
// function that differs may be an older annals' and is only named in a
// note ([NoteVersion]; [NotePrivileges] without SELECT); none is said when
// all are this version's. Each note has a cause (Report.NoteCauses):
// privileges and version a role or an upgrade can change, history (the
// deletions older than 0038, retention records lost before 0024) neither.
// After a migration that adds or changes a function, regenerate
// functions.json: go test ./verify -run TestFunctionsManifest -update. The view events_all is not looked at
// (Log reads the two tables it unites, events_archive and events,
// directly); deletions_recorded_after, whose body holds a value of the
// database's own, is checked only against the deletion records (a value
// lowered, or raised while none exists, is not seen).
package verify
