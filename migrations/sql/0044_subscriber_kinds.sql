-- annals schema: what kind of subscriber each subscriber name is.
--
-- Every subscriber keeps its position in the checkpoints of its name, and
-- nothing said whose name it was: `annals tail --subscriber NAME` given a
-- projection's, an observer's, a saga's or a relay's name shared its
-- checkpoint, and whenever the tail led it the handler skipped, for good,
-- every event the tail printed. The runner now records, at each start, the
-- kind of each subscriber it runs (projection, observer, saga, processor,
-- relay, tail: projection.Runner's kinds) beside the subscriber's partition
-- layout, and a tail refuses a name recorded as any kind but its own
-- (projection.SubscriberKindError; docs/operations.md, "Subscriber
-- kinds"). NULL: unknown, the rows of runners from before this migration;
-- the next runner of the name records its kind. A runner of this version
-- on a schema without the column records nothing and runs as before. No new
-- grant: the runner role updates subscriber_layouts already.
ALTER TABLE {{.Schema}}.subscriber_layouts
    ADD COLUMN kind text CONSTRAINT subscriber_layouts_kind_named CHECK (kind <> '');

COMMENT ON COLUMN {{.Schema}}.subscriber_layouts.kind IS
    'annals: the kind of subscriber last run under this name (projection, observer, saga, processor, relay, tail); NULL: unknown (recorded by no runner yet).';
