package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/internal/leadership"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/internal/standby"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/walsource"
)

// lagCountLimit bounds the exact count of lagging events per subscriber
// partition: beyond it, status reports head - position instead (an upper
// bound, since rolled-back appends leave holes in the positions).
const lagCountLimit = 10_000

// defaultStaleAfter is three heartbeats of the runner (10 s each).
const defaultStaleAfter = 30 * time.Second

func (e *env) statusCommand() *cobra.Command {
	var format *string
	var staleAfter time.Duration
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show each subscriber's checkpoint, lag and leader, and the runner instances",
		Long: `For each subscriber partition: its checkpoint position, the head of the log, the lag
in events and in seconds, the leading instance and the fencing epoch; then every runner
instance, its heartbeat, its state, and what it leads.

Lag in events is the number of events after the checkpoint, counted exactly up to 10000;
beyond that it is head - position, shown as ~N (an upper bound: rolled-back appends
leave holes in the positions). Lag in seconds is the age of the oldest event after the
checkpoint, 0 when caught up. All ages use the database server's clock.

Who leads a partition (the LEADER column, and "leader" in JSON, which always agree):
the partition's advisory lock, read live from pg_locks, has the last word, since a
leader holds it for as long as it leads. When the lock is free, nobody leads: the
column says "(none: X's lock is free)" when a live instance X still lists the partition
(X was killed a moment ago: its heartbeat is fresh, its lock gone), else the
checkpoint's last owner with "(no live leader)". When the lock is held, the leader is
the live instance that lists the partition in its heartbeat (with "(at epoch N)" when
it leads at an epoch other than the checkpoint's, as after 'annals checkpoint set'),
unless the checkpoint was claimed since by another instance (a leader claims the
checkpoint after taking the lock, before its next heartbeat lists the partition): then
that owner leads, shown with "(lock held by backend PID)", as is the owner when no live
instance lists the partition (a hung process whose heartbeat is stale but whose session
still holds the lock, a rebuild, a relay, 'annals tail --subscriber'). When no live
instance lists a partition whose lock is held, the column says so: "OWNER (lock held by
backend PID, no live instance)", or "(lock held by backend PID, no live instance)" with
no owner to name (a rebuild's owner, rebuild:..., keeps "(lock held by backend PID)"),
and a NO LIVE INSTANCE line under the table names the backend and the remedy: unless a
catch-up or 'annals tail --subscriber' holds it, nobody processes the partition (a frozen
runner, or a session left holding the lock: a pooler's server session, a psql session). A generation of a blue/green
read model is named as such, with its state (building, live, retired); a retired one is
not run, so it gets no STOPPED line or dead-letter advice.

An instance's STATE is
  live   its last heartbeat is within --stale-after, and it holds (by the rule above)
         at least one of the partitions it lists, or lists none;
  lost   its heartbeat is fresh, but it holds none of the partitions it lists: each
         one's lock is free or another instance leads it (killed a moment ago, or its
         database session dropped); its row stays until it ages out;
  stale  its last heartbeat is older than --stale-after (a stopped or hung process,
         which may still hold locks: LEADS shows those it does).
Live runners delete rows older than their InstanceExpiry (by default 10 heartbeats).
LEADS lists the partitions the instance lists and leads by the rule above, then
"(listed, not held: ...)" for those it lists but does not lead, so no partition is
shown as led by two instances.

--output json writes one object:
  {"schema", "head", "checked_at", "stale_after_seconds",
   "subscribers": [{"subscriber", "partition", "position", "head", "lag_events",
                    "lag_events_exact", "lag_seconds", "epoch", "owner", "leader",
                    "leader_epoch", "heartbeat_leader", "heartbeat_leader_epoch",
                    "updated_at", "stopped_reason", "stopped_at", "dead_letters",
                    "lock_held", "lock_pid", "no_live_instance",
                    "generation": {"read_model", "generation", "state"}, "kind"}],
   "instances":   [{"instance_id", "host", "pid", "started_at", "last_heartbeat",
                    "heartbeat_age_seconds", "live", "state", "leads",
                    "leading": [{"subscriber", "partition", "epoch", "led_by"}],
                    "not_leading": [...the same]}],
   "replication_slots": [{"slot", "database", "active", "active_pid",
                    "confirmed_flush_lsn", "retained_bytes", "wal_status"}],
   "standbys":    [{"pid", "application_name", "client_addr", "state", "sync_state",
                    "replay_lag_bytes", "replay_lag_seconds"}]}
leader and leader_epoch are the LEADER column (null: nobody leads, or a session holds
the lock that no instance or owner names); owner is the checkpoint's owner, the
instance that claimed its epoch (null after an operator's set); heartbeat_leader and
heartbeat_leader_epoch are the raw heartbeat fact: the live instance listing the
partition, whether or not it holds the lock (null: none). stopped_reason and stopped_at
are null unless the Stop policy halted the partition; dead_letters counts its unresolved
(open or released) dead letters; lock_pid is the backend pid holding the lock (null:
free); no_live_instance is true when the lock is held but no live instance's heartbeat
lists the partition (leader then names the checkpoint's last claimant, which may be a
dead or frozen instance; the NO LIVE INSTANCE line); generation is null unless the subscriber is a blue/green generation (and for a
role that may not read read_model_generations); kind is what kind of subscriber the
runner recorded for the name (projection, observer, saga, processor, relay, tail; null:
unknown, as for a name only runners before migration 0044 ran). An instance's state is the STATE column
(live, lost, stale) and live is state = "live"; leads is its list of {"subscriber",
"partition", "epoch"} as stored; leading and not_leading split it as LEADS does, led_by
being the partition's leader (null: nobody; a lead of a partition with no checkpoint
counts as leading), and are null when leads is not such a list; the arrays are [] when
empty.

Replication slots (package walsource: a runner or relay woken from the WAL) are listed
when there are any: an inactive slot retains WAL until its consumer returns or it is
dropped; see docs/operations.md. So are the physical standbys streaming from the
server (a runner's read replica): REPLAY LAG is the WAL they have not replayed yet,
REPLAY LAG TIME PostgreSQL's replay_lag (0s when caught up and idle); their details are
null for a role without pg_read_all_stats.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if staleAfter <= 0 {
				return usagef("--stale-after must be positive")
			}
			q, err := e.queries()
			if err != nil {
				return err
			}
			pool, err := e.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			st, err := loadStatus(cmd.Context(), pool, q, e.schema, staleAfter)
			if err != nil {
				return err // an unmigrated schema is reported by run, as for every command
			}
			st.Schema = e.schema
			if *format == outputJSON {
				return writeJSON(e.stdout, st)
			}
			return writeStatusTable(e.stdout, st)
		},
	}
	format = addOutputFlag(cmd, true, outputText, outputJSON)
	cmd.Flags().DurationVar(&staleAfter, "stale-after", defaultStaleAfter, "an instance whose last heartbeat is older than this is stale")
	return cmd
}

// StatusJSON is the output of `annals status --output json`.
type StatusJSON struct {
	// Schema is the annals schema inspected.
	Schema string `json:"schema"`
	// Head is the position of the last event in the log (0: empty).
	Head int64 `json:"head"`
	// CheckedAt is the database server's time of the snapshot.
	CheckedAt time.Time `json:"checked_at"`
	// StaleAfterSeconds is the --stale-after threshold.
	StaleAfterSeconds float64 `json:"stale_after_seconds"`
	// Subscribers has one element per subscriber partition, ordered by
	// subscriber and partition.
	Subscribers []SubscriberStatus `json:"subscribers"`
	// Instances has one element per registered runner instance, ordered by ID.
	Instances []InstanceStatus `json:"instances"`
	// ReplicationSlots are the database's annals logical replication slots
	// (package walsource: the WAL wake-up and the relay's --wal), ordered by
	// name: whether a consumer streams, how far it confirmed, the WAL retained.
	ReplicationSlots []walsource.SlotStatus `json:"replication_slots"`
	// Standbys are the physical standbys streaming from the server
	// (pg_stat_replication), such as the read replica of a runner's
	// ReadPool: how far behind each has replayed.
	Standbys []StandbyStatus `json:"standbys"`
}

// StandbyStatus is one physical standby in StatusJSON (package standby,
// which the console reads too). Its details are null for a role without
// pg_read_all_stats (PostgreSQL shows it only the walsender's PID).
type StandbyStatus = standby.Standby

// SubscriberStatus is one subscriber partition in StatusJSON.
type SubscriberStatus struct {
	Subscriber string `json:"subscriber"`
	Partition  int    `json:"partition"`
	// Position is the checkpoint: the last position processed.
	Position int64 `json:"position"`
	// Head is the position of the last event in the log.
	Head int64 `json:"head"`
	// LagEvents is the number of events after Position when
	// LagEventsExact; otherwise (more than 10000) Head - Position, an upper
	// bound.
	LagEvents      int64 `json:"lag_events"`
	LagEventsExact bool  `json:"lag_events_exact"`
	// LagSeconds is the age of the oldest event after Position (0: caught up).
	LagSeconds float64 `json:"lag_seconds"`
	// Epoch is the checkpoint's fencing epoch.
	Epoch int64 `json:"epoch"`
	// Owner is the instance that claimed Epoch (null after an operator's set).
	Owner *string `json:"owner"`
	// Leader is the instance leading the partition, as the LEADER column
	// of the table says: the lock, read live, has the last word (null:
	// its lock is free, or held by a session nothing names). See
	// resolveLeaders.
	Leader *string `json:"leader"`
	// LeaderEpoch is the epoch the leader leads at (null: unknown).
	LeaderEpoch *int64 `json:"leader_epoch"`
	// HeartbeatLeader is the live instance whose heartbeat lists the
	// partition, preferring one at the checkpoint's epoch, whether or not
	// it holds the lock (null: none); HeartbeatLeaderEpoch is the epoch it
	// lists.
	HeartbeatLeader      *string `json:"heartbeat_leader"`
	HeartbeatLeaderEpoch *int64  `json:"heartbeat_leader_epoch"`
	// UpdatedAt is when the checkpoint row last changed.
	UpdatedAt time.Time `json:"updated_at"`
	// StoppedReason is why the partition is halted by the Stop policy (null:
	// running); StoppedAt is since when.
	StoppedReason *string    `json:"stopped_reason"`
	StoppedAt     *time.Time `json:"stopped_at"`
	// DeadLetters counts its unresolved dead letters (open or released).
	DeadLetters int64 `json:"dead_letters"`
	// LockHeld reports whether a session holds the partition's advisory
	// lock, as a leader does (read live from pg_locks: a process killed a
	// moment ago still has a fresh heartbeat, but its lock is free);
	// LockPID is that session's backend pid (null: free).
	LockHeld bool   `json:"lock_held"`
	LockPID  *int32 `json:"lock_pid"`
	// NoLiveInstance reports a lock held while no live instance's heartbeat
	// lists the partition (leadership.Unlisted): whoever holds it (LockPID)
	// is no live runner instance. Leader then names the checkpoint's last
	// claimant, as the console and the projections commands do: a rebuild
	// or a catch-up that leads without heartbeats, or a dead or frozen
	// instance whose session, or a pooler's server session, was left
	// holding the lock, in which case nobody processes the partition.
	NoLiveInstance bool `json:"no_live_instance"`
	// Generation is set when the subscriber is a generation of a blue/green
	// read model (null otherwise, and for a role that may not read
	// read_model_generations).
	Generation *GenerationStatus `json:"generation"`
	// Kind is the kind of subscriber the runner recorded for the name
	// (projection, observer, saga, processor, relay, tail: migration 0044;
	// null: unknown, for a name only older runners ran, a blue/green
	// generation, a schema before 0044, or a role that may not read
	// subscriber_layouts).
	Kind *string `json:"kind"`
}

// GenerationStatus says which blue/green generation a subscriber runs.
type GenerationStatus struct {
	// ReadModel is the projection's name, Generation its number.
	ReadModel  string `json:"read_model"`
	Generation int    `json:"generation"`
	// State is building, live or retired.
	State string `json:"state"`
}

// InstanceStatus is one runner instance in StatusJSON.
type InstanceStatus struct {
	InstanceID          string    `json:"instance_id"`
	Host                string    `json:"host"`
	PID                 int       `json:"pid"`
	StartedAt           time.Time `json:"started_at"`
	LastHeartbeat       time.Time `json:"last_heartbeat"`
	HeartbeatAgeSeconds float64   `json:"heartbeat_age_seconds"`
	// Live is State == "live".
	Live bool `json:"live"`
	// State is the STATE column: live, lost (a fresh heartbeat, but none
	// of the partitions it lists is led by it: see resolveInstances) or
	// stale (the last heartbeat is older than --stale-after).
	State string `json:"state"`
	// Leads is the instance's leads column as stored: the subscriber
	// partitions it leads, [{"subscriber", "partition", "epoch"}].
	Leads json.RawMessage `json:"leads"`
	// Leading are the Leads whose partition the instance leads by the
	// live lock (as SubscriberStatus.Leader says), NotLeading the others;
	// both are null when Leads is not such a list.
	Leading    []LeadStatus `json:"leading"`
	NotLeading []LeadStatus `json:"not_leading"`
}

// LeadStatus is one element of an instance's leads in InstanceStatus.
type LeadStatus struct {
	Subscriber string `json:"subscriber"`
	Partition  int    `json:"partition"`
	// Epoch is the epoch the instance lists (null: not a number).
	Epoch *int64 `json:"epoch"`
	// LedBy is the partition's leader (null: nobody, or a session nothing
	// names); the instance itself for a partition with no checkpoint.
	LedBy *string `json:"led_by"`
}

// readKinds fills in the kinds the runner recorded for the subscribers.
func readKinds(ctx context.Context, tx pgx.Tx, q map[string]string, schema string, subs []SubscriberStatus) error {
	var can bool
	if err := tx.QueryRow(ctx, q["CanReadKinds"], schema).Scan(&can); err != nil || !can || len(subs) == 0 {
		return errors.Wrap(err, "status: read the subscriber kinds")
	}
	rows, err := tx.Query(ctx, q["Kinds"])
	if err != nil {
		return errors.Wrap(err, "status: read the subscriber kinds")
	}
	kinds := map[string]string{}
	var sub, kind string
	if _, err := pgx.ForEachRow(rows, []any{&sub, &kind}, func() error {
		kinds[sub] = kind
		return nil
	}); err != nil {
		return errors.Wrap(err, "status: read the subscriber kinds")
	}
	for i := range subs {
		if k, ok := kinds[subs[i].Subscriber]; ok {
			subs[i].Kind = &k
		}
	}
	return nil
}

// readLocksAndGenerations fills in the subscribers' lock holders and
// blue/green generations.
func readLocksAndGenerations(ctx context.Context, tx pgx.Tx, q map[string]string, schema string, subs []SubscriberStatus) error {
	if len(subs) > 0 {
		k1, k2 := make([]int32, len(subs)), make([]int32, len(subs))
		for i, s := range subs {
			k1[i], k2[i] = lockkey.Pair(catchup.LockKey(schema, s.Subscriber, s.Partition))
		}
		locks, err := leadership.LockStates(ctx, tx, k1, k2)
		if err != nil {
			return errors.Wrap(err, "status")
		}
		for i, l := range locks {
			if l.Held {
				p := l.PID
				subs[i].LockHeld, subs[i].LockPID = true, &p
			}
		}
	}
	var can bool
	if err := tx.QueryRow(ctx, q["CanReadGenerations"], schema).Scan(&can); err != nil || !can {
		return errors.Wrap(err, "status: read the blue/green generations")
	}
	rows, err := tx.Query(ctx, q["Generations"])
	if err != nil {
		return errors.Wrap(err, "status: read the blue/green generations")
	}
	gens := map[string]*GenerationStatus{}
	var (
		sub string
		g   GenerationStatus
	)
	_, err = pgx.ForEachRow(rows, []any{&sub, &g.ReadModel, &g.Generation, &g.State}, func() error {
		c := g
		gens[sub] = &c
		return nil
	})
	if err != nil {
		return errors.Wrap(err, "status: read the blue/green generations")
	}
	for i := range subs {
		subs[i].Generation = gens[subs[i].Subscriber]
	}
	return nil
}

// loadStatus reads the status in one snapshot.
func loadStatus(ctx context.Context, pool *pgxpool.Pool, q map[string]string, schema string, staleAfter time.Duration) (*StatusJSON, error) {
	st := &StatusJSON{
		StaleAfterSeconds: staleAfter.Seconds(),
		Subscribers:       []SubscriberStatus{},
		Instances:         []InstanceStatus{},
		ReplicationSlots:  []walsource.SlotStatus{},
		Standbys:          []StandbyStatus{},
	}
	stale := staleAfter.Microseconds()
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, q["Head"]).Scan(&st.Head, &st.CheckedAt); err != nil {
			return errors.Wrap(err, "status: read the head")
		}
		rows, err := tx.Query(ctx, q["Subscribers"], stale, lagCountLimit)
		if err != nil {
			return errors.Wrap(err, "status: read the checkpoints, their leaders and dead letters")
		}
		var s SubscriberStatus
		var counted int64
		_, err = pgx.ForEachRow(rows, []any{&s.Subscriber, &s.Partition, &s.Position, &s.Epoch, &s.Owner, &s.UpdatedAt,
			&counted, &s.LagSeconds, &s.HeartbeatLeader, &s.HeartbeatLeaderEpoch, &s.StoppedReason, &s.StoppedAt, &s.DeadLetters}, func() error {
			s.Head = st.Head
			s.LagEvents, s.LagEventsExact = counted, true
			if counted > lagCountLimit {
				s.LagEvents, s.LagEventsExact = max(st.Head-s.Position, counted), false
			}
			s.UpdatedAt = s.UpdatedAt.UTC()
			st.Subscribers = append(st.Subscribers, s)
			s = SubscriberStatus{} // the pointers must not be shared
			return nil
		})
		if err != nil {
			return errors.Wrap(err, "status: read the checkpoints, their leaders and dead letters")
		}
		if err := readLocksAndGenerations(ctx, tx, q, schema, st.Subscribers); err != nil {
			return err
		}
		if err := readKinds(ctx, tx, q, schema, st.Subscribers); err != nil {
			return err
		}
		resolveLeaders(st.Subscribers)
		rows, err = tx.Query(ctx, q["Instances"], stale)
		if err != nil {
			return errors.Wrap(err, "status: read the instances")
		}
		var in InstanceStatus
		var leads []byte
		_, err = pgx.ForEachRow(rows, []any{&in.InstanceID, &in.Host, &in.PID, &in.StartedAt, &in.LastHeartbeat,
			&leads, &in.Live, &in.HeartbeatAgeSeconds}, func() error {
			in.Leads = json.RawMessage(append([]byte(nil), leads...))
			in.StartedAt, in.LastHeartbeat = in.StartedAt.UTC(), in.LastHeartbeat.UTC()
			st.Instances = append(st.Instances, in)
			in = InstanceStatus{}
			return nil
		})
		if err != nil {
			return errors.Wrap(err, "status: read the instances")
		}
		resolveInstances(st.Instances, st.Subscribers)
		slots, err := walsource.Slots(ctx, tx)
		if err != nil {
			return errors.Wrap(err, "status: read the replication slots")
		}
		st.ReplicationSlots = append(st.ReplicationSlots, slots...)
		st.Standbys, err = standby.List(ctx, tx)
		return errors.Wrap(err, "status")
	})
	st.CheckedAt = st.CheckedAt.UTC()
	return st, err
}

// writeStatusTable writes the subscribers and the instances as tables lined
// up by display width (textTable: text/tabwriter counted runes, so a CJK
// subscriber name pushed the columns after it out of line), each with the
// lines about it after it.
func writeStatusTable(w io.Writer, st *StatusJSON) error {
	var b strings.Builder
	if len(st.Subscribers) == 0 {
		fmt.Fprintf(&b, "No subscribers yet: no checkpoints in schema %q (head of the log: %d).\n", st.Schema, st.Head)
	} else {
		var tbl textTable
		tbl.add("SUBSCRIBER", "PARTITION", "KIND", "POSITION", "HEAD", "LAG", "LAG TIME", "EPOCH", "LEADER")
		for _, s := range st.Subscribers {
			lag := strconv.FormatInt(s.LagEvents, 10)
			if !s.LagEventsExact {
				lag = "~" + lag
			}
			kind := "-"
			if s.Kind != nil {
				kind = textCell(*s.Kind)
			}
			tbl.add(textCell(s.Subscriber), strconv.Itoa(s.Partition), kind, strconv.FormatInt(s.Position, 10), strconv.FormatInt(s.Head, 10),
				lag, formatSeconds(s.LagSeconds), strconv.FormatInt(s.Epoch, 10), textCell(leaderText(s)))
		}
		_ = tbl.write(&b)
	}
	seen := map[string]bool{}
	for _, s := range st.Subscribers {
		if g := s.Generation; g != nil && !seen[s.Subscriber] {
			seen[s.Subscriber] = true
			what := map[string]string{
				"live":     "serves the readers",
				"building": "being built; readers get it at the cut-over",
				"retired":  "retired by a cut-over, kept for a rollback until it is dropped: nothing runs it, so its lag means nothing",
			}[g.State]
			if what == "" {
				what = g.State
			}
			fmt.Fprintf(&b, "%s is generation %d of blue/green read model %s: %s\n", s.Subscriber, g.Generation, g.ReadModel, what)
		}
	}
	for _, s := range st.Subscribers {
		if s.StoppedReason != nil && !retired(s) {
			since := ""
			if s.StoppedAt != nil {
				since = " since " + s.StoppedAt.UTC().Format("2006-01-02 15:04:05Z")
			}
			fmt.Fprintf(&b, "STOPPED %s/%d%s: %s (act with 'annals dlq retry' or 'annals dlq skip')\n", s.Subscriber, s.Partition, since, *s.StoppedReason)
		}
	}
	for _, s := range st.Subscribers {
		b.WriteString(noLiveInstanceNote(s))
	}
	for _, s := range st.Subscribers {
		if s.DeadLetters > 0 && !retired(s) {
			fmt.Fprintf(&b, "%s/%d has %s: annals dlq list --subscriber %s\n", s.Subscriber, s.Partition, countNoun(s.DeadLetters, "unresolved dead letter"), s.Subscriber)
		}
	}
	b.WriteString("\n")
	if len(st.Instances) == 0 {
		b.WriteString("No runner instances registered.\n")
	} else {
		var tbl textTable
		tbl.add("INSTANCE", "HOST", "PID", "STARTED", "LAST HEARTBEAT", "STATE", "LEADS")
		for _, in := range st.Instances {
			state := in.State
			if state == "" && in.Live {
				state = "live"
			} else if state == "" {
				state = "stale"
			}
			tbl.add(textCell(in.InstanceID), textCell(in.Host), strconv.Itoa(in.PID),
				in.StartedAt.Format(timeLayout), in.LastHeartbeat.Format(timeLayout)+" ("+formatSeconds(in.HeartbeatAgeSeconds)+" ago)",
				state, textCell(leadsText(in)))
		}
		_ = tbl.write(&b)
	}
	// Slot names are lower-case letters, digits and underscores, its other
	// cells ASCII: a tabwriter's rune count is their display width.
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	writeSlotsTable(tw, st.ReplicationSlots)
	_ = tw.Flush()
	writeStandbysTable(&b, st.Standbys)
	_, err := io.WriteString(w, b.String())
	return err
}

const timeLayout = "2006-01-02 15:04:05Z"

// retired reports a subscriber that is a retired blue/green generation.
func retired(s SubscriberStatus) bool { return s.Generation != nil && s.Generation.State == "retired" }

// resolveLeaders sets each partition's Leader and LeaderEpoch from the
// facts read: its live lock, its heartbeat leader and its checkpoint's
// owner, by the rule of package leadership (the lock has the last word),
// which the console and the projections command tree apply too.
func resolveLeaders(subs []SubscriberStatus) {
	for i := range subs {
		s := &subs[i]
		f := leadership.Facts{Epoch: s.Epoch, LockHeld: s.LockHeld, HeartbeatEpoch: s.HeartbeatLeaderEpoch}
		if s.Owner != nil {
			f.Owner = *s.Owner
		}
		if s.HeartbeatLeader != nil {
			f.HeartbeatLeader = *s.HeartbeatLeader
		}
		s.Leader, s.LeaderEpoch = nil, nil
		if leader, epoch := leadership.Leader(f); leader != "" {
			s.Leader, s.LeaderEpoch = &leader, epoch
		}
		s.NoLiveInstance = leadership.Unlisted(f)
	}
}

// resolveInstances sets each instance's Leading, NotLeading, State and
// Live: a lead it lists counts as leading when the partition's Leader (see
// resolveLeaders) is the instance, or when the partition has no checkpoint
// (nothing to say otherwise). An instance with a fresh heartbeat that lists
// partitions but leads none of them is lost (killed a moment ago, or its
// session dropped: its locks are free or taken over).
func resolveInstances(ins []InstanceStatus, subs []SubscriberStatus) {
	type key struct {
		sub  string
		part int
	}
	leaders := make(map[key]*string, len(subs))
	for _, s := range subs {
		leaders[key{s.Subscriber, s.Partition}] = s.Leader
	}
	for i := range ins {
		in := &ins[i]
		fresh := in.Live
		in.State = leadership.State(fresh, 0, 0)
		var leads []struct {
			Subscriber string          `json:"subscriber"`
			Partition  int             `json:"partition"`
			Epoch      json.RawMessage `json:"epoch"`
		}
		if err := json.Unmarshal(in.Leads, &leads); err != nil || leads == nil {
			in.Leading, in.NotLeading = nil, nil
			continue
		}
		in.Leading, in.NotLeading = []LeadStatus{}, []LeadStatus{}
		for _, l := range leads {
			ls := LeadStatus{Subscriber: l.Subscriber, Partition: l.Partition}
			var epoch int64
			if json.Unmarshal(l.Epoch, &epoch) == nil {
				ls.Epoch = &epoch
			}
			leader, known := leaders[key{l.Subscriber, l.Partition}]
			if !known {
				id := in.InstanceID
				leader = &id
			}
			ls.LedBy = leader
			if leader != nil && *leader == in.InstanceID {
				in.Leading = append(in.Leading, ls)
			} else {
				in.NotLeading = append(in.NotLeading, ls)
			}
		}
		in.State = leadership.State(fresh, len(in.Leading)+len(in.NotLeading), len(in.Leading))
		in.Live = in.State == leadership.Live
	}
}

// leaderText is the LEADER column: Leader (see resolveLeaders), its epoch
// when it is not the checkpoint's, and why nobody leads when the lock is
// free.
func leaderText(s SubscriberStatus) string {
	switch {
	case retired(s) && !s.LockHeld:
		return "(retired: none)"
	case !s.LockHeld && s.HeartbeatLeader != nil:
		return fmt.Sprintf("(none: %s's lock is free)", *s.HeartbeatLeader)
	case !s.LockHeld && s.Owner != nil && *s.Owner != "":
		return *s.Owner + " (no live leader)"
	case !s.LockHeld:
		return "(no live leader)"
	case s.Leader != nil && s.LeaderEpoch != nil && *s.LeaderEpoch != s.Epoch:
		return fmt.Sprintf("%s (at epoch %d)", *s.Leader, *s.LeaderEpoch)
	case s.Leader != nil && s.HeartbeatLeader != nil && *s.HeartbeatLeader == *s.Leader:
		return *s.Leader
	case s.Leader != nil && s.LockPID != nil && s.NoLiveInstance && !rebuildOwned(s):
		return fmt.Sprintf("%s (lock held by backend %d, no live instance)", *s.Leader, *s.LockPID)
	case s.Leader != nil && s.LockPID != nil:
		return fmt.Sprintf("%s (lock held by backend %d)", *s.Leader, *s.LockPID)
	case s.Leader != nil:
		return *s.Leader
	case s.LockPID != nil && s.NoLiveInstance:
		return fmt.Sprintf("(lock held by backend %d, no live instance)", *s.LockPID)
	case s.LockPID != nil:
		return fmt.Sprintf("(lock held by backend %d)", *s.LockPID)
	}
	return "(lock held)"
}

// rebuildOwned reports a partition whose checkpoint a rebuild claimed last
// (projection.RebuildOwnerPrefix): a rebuild leads without heartbeats.
func rebuildOwned(s SubscriberStatus) bool {
	return s.Owner != nil && strings.HasPrefix(*s.Owner, projection.RebuildOwnerPrefix)
}

// noLiveInstanceNote is the line under the subscribers' table about a
// partition whose lock a session holds that no live instance lists, but
// for a rebuild's ("" then, and when there is nothing to say).
func noLiveInstanceNote(s SubscriberStatus) string {
	if !s.NoLiveInstance || s.LockPID == nil || rebuildOwned(s) {
		return ""
	}
	claimed := ""
	if s.Owner != nil && *s.Owner != "" {
		claimed = " (last claimed by " + *s.Owner + ")"
	}
	return fmt.Sprintf("NO LIVE INSTANCE %s/%d: its lock is held by backend %d%s, which no live instance lists in its heartbeat. "+
		"Unless a catch-up (Runner.RunUntilCaughtUp) or 'annals tail --subscriber' holds it, nobody processes the partition: "+
		"a frozen runner, or a session left holding the lock (a pooler's server session, a psql session). "+
		"Ending it frees the partition: SELECT pg_terminate_backend(%d); behind PgBouncer, RECONNECT on its admin console (docs/operations.md)\n",
		s.Subscriber, s.Partition, *s.LockPID, claimed, *s.LockPID)
}

// leadsText is the LEADS column: the partitions the instance leads,
// subscriber/partition, comma-separated, then those it lists but does not
// lead; or the stored JSON when it is not the expected list.
func leadsText(in InstanceStatus) string {
	if in.Leading == nil && in.NotLeading == nil {
		var leads []struct {
			Subscriber string `json:"subscriber"`
			Partition  int    `json:"partition"`
		}
		if err := json.Unmarshal(in.Leads, &leads); err != nil {
			return string(in.Leads)
		}
		in.Leading = make([]LeadStatus, len(leads))
		for i, l := range leads {
			in.Leading[i] = LeadStatus{Subscriber: l.Subscriber, Partition: l.Partition}
		}
	}
	names := func(ls []LeadStatus) string {
		parts := make([]string, len(ls))
		for i, l := range ls {
			parts[i] = fmt.Sprintf("%s/%d", l.Subscriber, l.Partition)
		}
		return strings.Join(parts, ", ")
	}
	text := names(in.Leading)
	if text == "" {
		text = "-"
	}
	if len(in.NotLeading) > 0 {
		text += " (listed, not held: " + names(in.NotLeading) + ")"
	}
	return text
}

// formatSeconds prints an age rounded to a precision that suits its size.
func formatSeconds(sec float64) string {
	d := time.Duration(sec * float64(time.Second))
	switch {
	case d <= 0:
		return "0s"
	case d < 10*time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}
