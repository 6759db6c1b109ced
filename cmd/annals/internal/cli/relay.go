package cli

import (
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/relay"
	"github.com/annals-dev/annals/walsource"
)

// onceWaitNote is how long relay --once works before it says what it is
// waiting for.
const onceWaitNote = 2 * time.Second

func (e *env) relayCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:         "relay",
		Short:       "Publish the log to a message broker, exactly once and in order",
		Annotations: map[string]string{groupAnnotation: ""},
		RunE: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("want a subcommand: nats")
			}
			return usagef("unknown subcommand %q: want nats", args[0])
		},
	}
	cmd.AddCommand(e.relayNATSCommand())
	return cmd
}

func (e *env) relayNATSCommand() *cobra.Command {
	var (
		natsURL, name, prefix, subject, stream string
		types                                  []string
		wal, once, adopt, status               bool
		duplicates, maxAge, ackTimeout         time.Duration
		batch, replicas                        int
		format                                 *string
	)
	cmd := &cobra.Command{
		Use:   "nats",
		Short: "Relay the log to NATS JetStream (leader-elected; runs until interrupted)",
		Long: `Publish every event (or those whose type matches --types globs) to a JetStream stream,
from the relay's checkpoint on, exactly once and in position order: the subject is
--subject with {prefix}, {type} and {stream} replaced (each value escaped into one token:
bytes other than ASCII letters, digits, - and _ become %XX, so "order.placed" is
"order%2Eplaced"); Nats-Msg-Id is the event ID; headers carry position, stream version,
type, correlation and causation IDs, the metadata and the trace context. The checkpoint
moves only past what JetStream acknowledged.

The relay is a subscriber named --name: one relay of a name leads cluster-wide, others
stand by and take over. It creates the stream (--stream, subjects from the template,
limits retention, --duplicates de-duplication window) or checks an existing one, and
refuses a stream written by another relay or from another log (cluster, database or
schema: --adopt-stream takes it once this database took over that log). With
--wal it is woken by its own logical replication slot instead of NOTIFY (wal_level =
logical and a role that may replicate: a running relay whose slot does not stream ends with
an error saying so; see docs/operations.md). With --once it publishes
up to the current head and exits, printing how far it got (--output text|json); it
first waits for the relay's lock while another relay process of this name runs, and
says so when it is not done within 2 s.

With --status it publishes nothing and takes no lock: it prints the relay's checkpoint
and the head of the log, the stream (messages, sequences, the log position of the newest
message) and each durable consumer of the stream (relay/natsconsumer's, or any other):
the stream sequence it has acknowledged through, how many messages it is behind,
delivered and unacknowledged, re-delivered, its waiting pull requests (a running
consumer that is caught up has one) and its last delivery; --output json as one object
{"relay", "checkpoint", "head", "lag_events", "stream": {"name", "created", "messages",
"first_seq", "last_seq", "last_position"} (null: no stream by the name), "consumers":
[{"name", "ack_floor_seq", "behind_messages", "delivered_seq", "ack_pending", "pending",
"redelivered", "waiting", "last_delivery"}]}.`,
		Example: `  annals relay nats --nats-url nats://127.0.0.1:4222
  annals relay nats --types 'order.*' --prefix acme.orders --stream ORDERS --wal
  annals relay nats --once --output json
  annals relay nats --status --nats-url nats://127.0.0.1:4222`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := catchup.ParseFilter(types); err != nil {
				return usageError{err}
			}
			if status && once {
				return usagef("--status and --once: choose one")
			}
			if batch < 0 || replicas < 0 || duplicates < 0 || maxAge < 0 || ackTimeout < 0 {
				return usagef("--batch-size, --replicas, --duplicates, --max-age and --ack-timeout must not be negative")
			}
			if maxAge > 0 && duplicates > maxAge {
				return usagef("--duplicates %v must not exceed --max-age %v: JetStream refuses a de-duplication window longer than the stream keeps messages", duplicates, maxAge)
			}
			// Before connecting: the relay would put its defaults in place
			// of empty values (an empty --name would lead, and fence, the
			// relay named "relay").
			if err := validRelayFlags(natsURL, name, prefix, subject, stream); err != nil {
				return err
			}
			pool, err := e.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1), nats.Name("annals relay "+name))
			if err != nil {
				// Not wrapped: its message may quote the URL, password
				// and all, or a piece of it (a parse error).
				if ue := (*url.Error)(nil); errors.As(err, &ue) {
					return errors.Newf("relay: connect to %s: not a valid URL (percent-encode any \"/\", \"@\", \":\" or \"%%\" in a user name, password or token)",
						redactNATSURLs(natsURL))
				}
				return errors.Newf("relay: connect to %s: %s", redactNATSURLs(natsURL), redactNATSSecrets(err.Error(), natsURL))
			}
			defer nc.Close()
			if status {
				return e.relayStatus(cmd.Context(), pool, nc, name, stream, *format)
			}
			logger := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
			cfg := &relay.Config{
				Name: name, Schema: e.schema, Types: types, Prefix: prefix, Subject: subject, Stream: stream,
				Replicas: replicas, Duplicates: duplicates, MaxAge: maxAge, BatchSize: batch, AckTimeout: ackTimeout, Logger: logger,
				AdoptStream: adopt,
			}
			if wal {
				if cfg.WAL, err = walsource.NewWake(cmd.Context(), pool, &walsource.WakeConfig{Schema: e.schema, Logger: logger}); err != nil {
					return err
				}
			}
			r, err := relay.New(pool, nc, cfg)
			if err != nil {
				if errors.Is(err, relay.ErrInvalidSubject) {
					return usageError{err}
				}
				return err
			}
			if !once {
				// Said once at the start: a relay standing by (another
				// process of the name leads) said nothing at all.
				logger.Info("annals: relay started: it publishes while it leads; it stands by while another relay process of this name leads "+
					"(annals status shows the leader; annals relay nats --status, the stream and its consumers)",
					slog.String("relay", name), slog.String("nats", nc.ConnectedUrlRedacted()), slog.String("stream", stream),
					slog.String("subjects", r.SubjectFilter()), slog.Bool("wal", wal), slog.String("schema", e.schema))
				return r.Run(cmd.Context())
			}
			// CatchUp waits for the relay's lock without a word: say so
			// when it takes a while (another relay process leading, or a
			// long backlog).
			caught, noted := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(noted)
				select {
				case <-caught:
				case <-time.After(onceWaitNote):
					logger.Info("annals: relay --once: not done yet: publishing a backlog, or waiting for the relay's lock, "+
						"which another relay process of this name holds while it runs (annals status shows its leader)",
						slog.String("relay", name))
				}
			}()
			err = r.CatchUp(cmd.Context())
			close(caught)
			<-noted // its note is written before anything else is
			if err != nil {
				return err
			}
			cps, err := checkpoint.New(e.schema)
			if err != nil {
				return err
			}
			cp, err := cps.Load(cmd.Context(), pool, name, 0)
			if err != nil && !errors.Is(err, checkpoint.ErrNotFound) {
				return errors.Wrap(err, "relay: read the checkpoint")
			}
			pos := cp.Position
			out := struct {
				Relay    string `json:"relay"`
				Stream   string `json:"stream"`
				Subjects string `json:"subjects"`
				Position int64  `json:"position"`
			}{name, stream, r.SubjectFilter(), pos}
			if *format == outputJSON {
				return writeJSON(e.stdout, out)
			}
			_, err = fmt.Fprintf(e.stdout, "relay %s: stream %s (%s) holds the log through position %d\n", out.Relay, out.Stream, out.Subjects, out.Position)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&natsURL, "nats-url", nats.DefaultURL, "NATS server URL(s), comma-separated")
	f.StringVar(&name, "name", "relay", "the relay's subscriber name (checkpoint, lock, replication slot)")
	f.StringSliceVar(&types, "types", nil, "event-type globs, comma-separated (default: all)")
	f.StringVar(&prefix, "prefix", "annals", "subject prefix (dot-separated tokens of letters, digits, - and _)")
	f.StringVar(&subject, "subject", relay.DefaultSubject, "subject template: {prefix}, {type}, {stream}")
	f.StringVar(&stream, "stream", "ANNALS", "JetStream stream to create or check")
	f.IntVar(&replicas, "replicas", 1, "the replicas of the stream the relay makes (3 keeps what JetStream acknowledged through a machine's crash; see docs/operations.md; 0: 1)")
	f.DurationVar(&duplicates, "duplicates", 10*time.Minute, "the stream's de-duplication window (longer than any takeover)")
	f.DurationVar(&maxAge, "max-age", 0, "how long the stream keeps messages (0: forever)")
	f.DurationVar(&ackTimeout, "ack-timeout", 10*time.Second, "wait for a batch's acknowledgements")
	f.IntVar(&batch, "batch-size", 500, "events per batch (one checkpoint commit each; 0: 500)")
	f.BoolVar(&wal, "wal", false, "wake from a logical replication slot instead of NOTIFY")
	f.BoolVar(&once, "once", false, "publish up to the current head, then exit")
	f.BoolVar(&status, "status", false, "print how far the relay and the stream's durable consumers have got, then exit (publishes nothing)")
	f.BoolVar(&adopt, "adopt-stream", false, "take a stream written from another origin (cluster, database, schema) as this log's: once, after a restore or pg_upgrade")
	format = addOutputFlag(cmd, false, outputText, outputJSON)
	return cmd
}

// validRelayFlags checks what relay nats can check of its flags before it
// connects to anything; relay.New checks the rest of the subject template,
// still before the relay takes its lock.
func validRelayFlags(natsURL, name, prefix, subject, stream string) error {
	if strings.TrimSpace(natsURL) == "" {
		return usagef("--nats-url must not be empty")
	}
	if strings.TrimSpace(name) == "" {
		return usagef("--name must not be empty: it is the relay's subscriber name")
	}
	if err := relay.CheckName(name); err != nil {
		return usageError{errors.Wrap(err, "--name")}
	}
	for _, tok := range strings.Split(prefix, ".") {
		if tok == "" || tok != relay.EscapeToken(tok) {
			return usagef("--prefix %q: want dot-separated tokens of letters, digits, - and _", prefix)
		}
	}
	if subject == "" {
		return usagef("--subject must not be empty")
	}
	if stream == "" || strings.ContainsAny(stream, " \t\r\n.*>/\\") {
		return usagef("--stream %q: want a JetStream stream name (not empty; no whitespace, '.', '*', '>', '/' or '\\')", stream)
	}
	return nil
}

// redactNATSURLs returns NATS server URLs (comma-separated, as --nats-url
// takes them) with the user information of each (natsUserinfos) replaced by
// "xxxxx": the user and password of nats://user:password@host, the token of
// nats://token@host. The user goes too: a token holding ":" reads as
// user:password, and its first half would be printed.
func redactNATSURLs(urls string) string {
	spans := natsUserinfos(urls)
	for i := len(spans) - 1; i >= 0; i-- {
		urls = urls[:spans[i][0]] + "xxxxx" + urls[spans[i][1]:]
	}
	return urls
}

// natsURLStart matches where a URL of a --nats-url list begins with its
// scheme: at the start of the list or after a comma, spaces allowed.
var natsURLStart = regexp.MustCompile(`(?:^|,)[ \t]*[A-Za-z][A-Za-z0-9+.\-]*://`)

// natsUserinfos returns the spans [start, end) of urls that hold user
// information. The list is not split on commas first, since a password or
// token may hold one: each URL runs from its scheme's "://" (or the start
// of the list) to the next URL that begins with a scheme, and its user
// information up to the last "@" in that run (a password may hold "@" or
// "/"). URLs without a scheme that follow another in the same run are taken
// into its user information when a later one of them has an "@": redacted
// with it, rather than guessed apart.
func natsUserinfos(urls string) [][2]int {
	ms := natsURLStart.FindAllStringIndex(urls, -1)
	var starts, ends []int // each run's user information would begin at start, and the run ends at end
	if len(ms) == 0 || ms[0][0] > 0 {
		starts = append(starts, len(urls)-len(strings.TrimLeft(urls, " \t")))
	}
	for _, m := range ms {
		if len(starts) > 0 {
			ends = append(ends, m[0])
		}
		starts = append(starts, m[1])
	}
	ends = append(ends, len(urls))
	var spans [][2]int
	for i, start := range starts {
		if at := strings.LastIndex(urls[start:ends[i]], "@"); at > 0 {
			spans = append(spans, [2]int{start, start + at})
		}
	}
	return spans
}

// redactNATSSecrets returns text with urls in it redacted (redactNATSURLs),
// and any piece of their user information left in it (as written, or
// percent-decoded: the whole, the user, the password or token, and what
// lies between ",", ":" and "@", as the NATS client may have split it)
// replaced by "xxxxx", the longest first.
func redactNATSSecrets(text, urls string) string {
	for _, v := range []string{urls, strings.TrimSpace(urls)} {
		if v != "" {
			text = strings.ReplaceAll(text, v, redactNATSURLs(v))
		}
	}
	var secrets []string
	for _, sp := range natsUserinfos(urls) {
		info := urls[sp[0]:sp[1]]
		user, pw, _ := strings.Cut(info, ":")
		pieces := append([]string{info, user, pw}, strings.FieldsFunc(info, func(r rune) bool { return strings.ContainsRune(",:@ \t", r) })...)
		for _, p := range pieces {
			secrets = append(secrets, p)
			if d, err := url.PathUnescape(p); err == nil {
				secrets = append(secrets, d)
			}
		}
	}
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	for _, secret := range secrets {
		if secret != "" {
			text = strings.ReplaceAll(text, secret, "xxxxx")
		}
	}
	return text
}
