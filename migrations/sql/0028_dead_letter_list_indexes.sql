-- annals schema: indexes for paging the dead-letter list by ID.
--
-- deadletter.List (annals dlq list, the console's dead-letter pages) pages
-- by ID, newest first, with a keyset cursor (Filter.Before / After): the
-- order created_at DESC, id DESC and its index dead_letters_newest (0003)
-- are no longer used. A page filtered by subscriber or by status walked the
-- primary key past every row of other subscribers or statuses (measured:
-- a page of status 'retry' at 0.1% of 200k rows scanned 100k rows, 62 ms;
-- with (status, id) about 1 ms). The two filters an operator uses get an
-- index each that serves a page as one backward range scan from the
-- cursor. dead_letters is small next to the log (one row per event a
-- subscriber gave up on), so the indexes are built in the migration's
-- transaction.

DROP INDEX IF EXISTS {{.Schema}}.dead_letters_newest;
CREATE INDEX IF NOT EXISTS dead_letters_by_subscriber ON {{.Schema}}.dead_letters (subscriber_id, id);
CREATE INDEX IF NOT EXISTS dead_letters_by_status ON {{.Schema}}.dead_letters (status, id);
