package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/migrations"
)

// Exit codes. They are documented in the root command's help and in
// docs/operations.md.
const (
	ExitOK       = 0
	ExitFailure  = 1
	ExitUsage    = 2 // bad flags, arguments or input: nothing changed
	ExitNotFound = 3 // what the command names does not exist: nothing changed
)

// exitCodesHelp is the exit-code paragraph of the root command's help.
const exitCodesHelp = `Exit codes: 0 success; 1 failure; 2 bad flags, arguments or input (an unknown
command, a malformed value or event, an invalid schema name); 3 not found (the dead letter,
cron task, timer, subscriber, stream or role named does not exist; a deleted stream exists:
reading or deleting it again exits 1). Exit 2 and 3 change nothing.`

// usageError marks a mistake in the command line: exit code 2.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// notFoundError marks something the command line names that does not exist
// (a dead letter, cron task, timer, subscriber, stream or role): exit code 3.
type notFoundError struct{ err error }

func (n notFoundError) Error() string { return n.err.Error() }
func (n notFoundError) Unwrap() error { return n.err }

func notFoundf(format string, args ...any) error {
	return notFoundError{fmt.Errorf(format, args...)}
}

// env is what every command shares.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	// rawStdout and rawStderr are the writers stdout and stderr wrap (see
	// safeWriter): for a child process's output, which is not annals'.
	rawStdout, rawStderr io.Writer
	getenv               func(string) string
	databaseURL          string
	schema               string
}

// Run executes the annals command line with args (without the program name)
// and returns the process exit code.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return run(ctx, args, stdin, stdout, stderr, os.Getenv)
}

func run(ctx context.Context, args []string, stdin io.Reader, rawStdout, rawStderr io.Writer, getenv func(string) string) int {
	safeOut, safeErr := newSafeWriter(rawStdout), newSafeWriter(rawStderr)
	defer func() {
		_ = safeOut.Flush()
		_ = safeErr.Flush()
	}()
	var stdout, stderr io.Writer = safeOut, safeErr
	e := &env{stdin: stdin, stdout: stdout, stderr: stderr, rawStdout: rawStdout, rawStderr: rawStderr, getenv: getenv}
	root := e.rootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	var ue usageError
	if errors.As(err, &ue) || errors.Is(err, eventstore.ErrInvalidEvent) || errors.Is(err, schemaname.ErrInvalid) {
		fmt.Fprintf(stderr, "annals: %s\n", oneLine(err))
		if cmd.Hidden { // a pointer elsewhere (projections): no help of its own
			cmd = cmd.Root()
		}
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return ExitUsage
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	err = withGrantHint(cmd, err)
	if migrations.IsNotMigrated(err) {
		// Found on the error path only: the happy path pays no check. One
		// message for every command, however the library or the command
		// wrapped PostgreSQL's error (some wraps already suggest a
		// migration; the user sees the suggestion once), with PostgreSQL's
		// own words on what is missing.
		fmt.Fprintf(stderr, "annals: schema %q is missing or not migrated (or migrated by an older annals than this one): 'annals migrate' creates or upgrades it (%s)\n", e.schema, oneLine(pgCause(err)))
		return ExitFailure
	}
	fmt.Fprintf(stderr, "annals: %s\n", oneLine(err))
	var nf notFoundError
	if errors.As(err, &nf) {
		return ExitNotFound
	}
	return ExitFailure
}

// pgCause is the PostgreSQL error in err's chain, or err without one.
func pgCause(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr
	}
	return err
}

// exitError ends the process with a code and no message (for `dev -- CMD`,
// which passes on the child's exit code).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// oneLine is err's message on one line, without a leading "annals: " (some
// errors of the library start with it; run prints it once, before them all).
func oneLine(err error) string {
	msg := strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", " ")
	for strings.HasPrefix(msg, "annals: ") {
		msg = strings.TrimPrefix(msg, "annals: ")
	}
	return msg
}

func (e *env) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "annals",
		Short: "annals: an event store and subscription runner on PostgreSQL",
		Long: "annals works against any PostgreSQL database given by --database-url or $DATABASE_URL.\n" +
			exitCodesHelp,
		// Without Args and RunE, cobra reports an unknown command as a plain
		// error (exit 1); here it is a usage error like any other.
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			return usagef("unknown command %q for %q", args[0], cmd.CommandPath())
		},
		Annotations:   map[string]string{groupAnnotation: ""},
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	// --version prints what 'annals version' prints. An embedded migration
	// that does not load fails every command alike, so its error is left to them.
	v, _ := buildVersion()
	root.Version = v.String()
	root.SetVersionTemplate("{{.Version}}\n")
	root.PersistentFlags().StringVar(&e.databaseURL, "database-url", "", "PostgreSQL URL (default $DATABASE_URL)")
	root.PersistentFlags().StringVar(&e.schema, "schema", schemaname.Default, "schema holding the annals tables")
	root.SetFlagErrorFunc(flagError)
	root.AddCommand(
		e.migrateCommand(),
		e.appendCommand(),
		e.readCommand(),
		e.statusCommand(),
		e.checkpointCommand(),
		e.dlqCommand(),
		e.tailCommand(),
		e.devCommand(),
		e.benchCommand(),
		e.scheduleCommand(),
		e.grantCommand(),
		e.verifyCommand(),
		e.versionCommand(),
		e.streamCommand(),
		e.scavengeCommand(),
		e.archiveCommand(),
		e.relayCommand(),
		e.uiCommand(),
		e.forgetCommand(),
		e.advisoryLocksCommand(),
		e.projectionsHintCommand(),
	)
	// cobra's own completion command (annals completion bash|zsh|fish|
	// powershell), made here rather than when executing so that a missing or
	// unknown shell is a usage error like any other unknown subcommand. It
	// keeps the writer it finds now, so stdout is set first.
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			c.Args = cobra.ArbitraryArgs
			c.Annotations = map[string]string{groupAnnotation: ""}
			c.RunE = func(_ *cobra.Command, args []string) error {
				if len(args) == 0 {
					return usagef("want a shell: bash, zsh, fish or powershell")
				}
				return usagef("unknown shell %q: want bash, zsh, fish or powershell", args[0])
			}
		}
	}
	wrapArgs(root)
	return root
}

// negativeArgAnnotation, among a command's Annotations, is the message (a
// format of the argument) for a negative number given as an argument, which
// the flag parser takes for a group of unknown shorthand flags ("-1").
const negativeArgAnnotation = "annals:negative-arg"

// groupAnnotation, among a command's Annotations, marks a group of
// subcommands whose RunE only reports a missing or unknown subcommand
// (args[0]) as a usage error.
const groupAnnotation = "annals:group"

// flagError makes a flag error a usage error, saying what is wrong with a
// negative number given where the command has its negativeArgAnnotation. A
// mistyped subcommand is reported as such, not its flags (see
// unknownSubcommand).
func flagError(c *cobra.Command, err error) error {
	if uerr := unknownSubcommand(c); uerr != nil {
		return uerr
	}
	var pe positionError
	if errors.As(err, &pe) {
		return usageError{pe}
	}
	if nerr := numberFlagError(err); nerr != nil {
		return nerr
	}
	if format, ok := c.Annotations[negativeArgAnnotation]; ok {
		if arg, ok := negativeNumber(err); ok {
			return usagef(format, arg)
		}
	}
	return usageError{err}
}

// wantAnnotation, among a flag's Annotations, is what the flag wants (the
// words after "want" in its usage error, such as "1 to 1000") when its value
// is no number; without it an integer flag wants "an integer".
const wantAnnotation = "annals:want"

// setWant sets the wantAnnotation of cmd's flag name.
func setWant(cmd *cobra.Command, name, want string) {
	if err := cmd.Flags().SetAnnotation(name, wantAnnotation, []string{want}); err != nil {
		panic(err) // a flag that is not defined: a mistake in the command
	}
}

// numberFlagError is the usage error of a flag given a value that is no
// number (or one out of range) in the CLI's words, as a malformed position's
// is, instead of strconv's ('invalid argument "abc" for "--before" flag:
// strconv.ParseInt: parsing "abc": invalid syntax'), or nil for another
// error. The commands check the range of the values that parse.
func numberFlagError(err error) error {
	var ive *pflag.InvalidValueError
	var ne *strconv.NumError
	if !errors.As(err, &ive) || !errors.As(err, &ne) {
		return nil
	}
	f := ive.GetFlag()
	want := "an integer"
	switch typ := f.Value.Type(); {
	case typ == "bool":
		want = "true or false"
	case strings.HasPrefix(typ, "float"):
		want = "a number"
	case strings.HasSuffix(typ, "Slice"):
		want = "integers separated by commas"
	}
	if w := f.Annotations[wantAnnotation]; len(w) > 0 {
		want = w[0]
	} else if errors.Is(ne.Err, strconv.ErrRange) {
		want += ", this one is out of range"
	}
	return usagef("--%s %q: want %s", f.Name, ive.GetValue(), want)
}

// positionFlag is a flag that takes a position of the log. A value that is
// no integer is refused as checkpoint set refuses its POSITION, not with
// strconv's words; the command checks the range.
type positionFlag struct {
	name string // without the dashes
	v    int64
}

// addPositionFlag defines the position flag name on cmd.
func addPositionFlag(cmd *cobra.Command, name, usage string) *positionFlag {
	p := &positionFlag{name: name}
	cmd.Flags().Var(p, name, usage)
	return p
}

func (p *positionFlag) String() string { return strconv.FormatInt(p.v, 10) }
func (p *positionFlag) Type() string   { return "position" }

func (p *positionFlag) Set(s string) error {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return positionError{"--" + p.name, s}
	}
	p.v = v
	return nil
}

// positionError is a positionFlag's malformed value; flagError reports it
// alone (the flag parser's message around it would say it twice).
type positionError struct{ flag, value string }

func (e positionError) Error() string {
	return fmt.Sprintf("%s %q: want a non-negative integer", e.flag, e.value)
}

// unknownSubcommand is the error of a command with subcommands whose first
// argument (flags aside) names none of them, or nil. cobra runs such a
// command itself, with the subcommand's flags, which it does not know: in
// 'annals dlq lsit --subscriber mailer' the mistake is "lsit", not the flag
// that the parser stopped at. A group says so with its own RunE; another
// command with subcommands (archive, whose arguments are none) with its
// argument check.
func unknownSubcommand(c *cobra.Command) error {
	args := c.Flags().Args()
	if !c.HasSubCommands() || len(args) == 0 {
		return nil
	}
	for _, sub := range c.Commands() {
		if sub.Name() == args[0] || sub.HasAlias(args[0]) {
			return nil
		}
	}
	if _, ok := c.Annotations[groupAnnotation]; ok && c.RunE != nil {
		return c.RunE(c, args)
	}
	if err := c.ValidateArgs(args); err != nil {
		return usageError{err}
	}
	return nil
}

// negativeNumber returns the argument an unknown-shorthand-flag error names
// when it is a negative number such as -1 or -2.5.
func negativeNumber(err error) (string, bool) {
	msg := err.Error()
	i := strings.LastIndex(msg, " in -")
	if !strings.HasPrefix(msg, "unknown shorthand flag: ") || i < 0 {
		return "", false
	}
	arg := msg[i+len(" in "):]
	if len(arg) < 2 || arg[1] < '0' || arg[1] > '9' {
		return "", false
	}
	if _, err := strconv.ParseFloat(arg, 64); err != nil {
		return "", false
	}
	return arg, true
}

// wrapArgs makes the argument errors of c and of every command under it
// usage errors (exit 2), however deep: a command under one that is no group
// (archive status, relay nats) was left out and exited 1. A wrong number of
// arguments is said in the CLI's words, with the arguments the command takes
// (its Use), not cobra's ("accepts 2 arg(s), received 1").
func wrapArgs(c *cobra.Command) {
	for _, sub := range c.Commands() {
		wrapArgs(sub)
	}
	if c.Args == nil {
		return
	}
	check := c.Args
	c.Args = func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			// cobra's count checks (ExactArgs, MaximumNArgs, MinimumNArgs,
			// RangeArgs) all say "arg(s)"; a command's own check says
			// what it wants already.
			if strings.Contains(err.Error(), " arg(s)") {
				path := strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
				takes := strings.TrimSpace(strings.TrimPrefix(cmd.Use, cmd.Name()))
				return usagef("%s takes %s, got %s", path, takes, countNoun(len(args), "argument"))
			}
			return usageError{err}
		}
		return nil
	}
}

func (e *env) validSchema() error {
	if err := schemaname.Validate(e.schema); err != nil {
		return usageError{err}
	}
	return nil
}

// pinnedSearchPath is the search_path of the CLI's sessions: annals'
// statements name its schema, and a name they leave unqualified (a
// function, an operator) resolves in pg_catalog only, never to an object
// another role planted in public (see connect).
const pinnedSearchPath = "pg_catalog, pg_temp"

// connect opens a pool on the configured database, its sessions' search_path
// pinned to pinnedSearchPath: the commands run as whoever the operator is,
// often the schema's owner or a superuser, and a name of their SQL that an
// object planted in a schema on the search_path matches better than
// pg_catalog's would run the planter's code as that role. It is sent at
// start-up, so a session-level SET never outlives the connection behind a
// pooler; a pooler that refuses it (PgBouncer without search_path in
// track_extra_parameters) gets the connection without it, and a note on
// stderr. A search_path the URL sets (search_path=…, or options=-c
// search_path=…, PGOPTIONS) is kept.
func (e *env) connect(ctx context.Context, maxConns ...int32) (*pgxpool.Pool, error) {
	return e.open(ctx, true, maxConns...)
}

// connectUnpinned is connect for annals bench, whose raw contenders name
// their tables as a client's statements do, under the URL's search_path.
func (e *env) connectUnpinned(ctx context.Context, maxConns ...int32) (*pgxpool.Pool, error) {
	return e.open(ctx, false, maxConns...)
}

func (e *env) open(ctx context.Context, pin bool, maxConns ...int32) (*pgxpool.Pool, error) {
	if err := e.validSchema(); err != nil {
		return nil, err
	}
	url := e.databaseURL
	if url == "" {
		url = e.getenv("DATABASE_URL")
	}
	if url == "" {
		return nil, usagef("no database: set --database-url or DATABASE_URL (try 'annals dev' for a throwaway one)")
	}
	return e.openURL(ctx, url, pin, maxConns...)
}

// openURL is open on url (a replica's, say), pinned as connect pins. Its
// errors hold no piece of the URL's password (redactDBURL).
func (e *env) openURL(ctx context.Context, url string, pin bool, maxConns ...int32) (*pgxpool.Pool, error) {
	pool, err := e.openURLUnredacted(ctx, url, pin, maxConns...)
	return pool, redactDBURL(err, url)
}

func (e *env) openURLUnredacted(ctx context.Context, url string, pin bool, maxConns ...int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, usagef("invalid database URL: %v", err)
	}
	cfg.MaxConns = 4
	if len(maxConns) == 1 {
		cfg.MaxConns = maxConns[0]
	}
	if pin && !strings.Contains(strings.ToLower(url), "default_query_exec_mode") {
		// No statement prepared by name: a pooler in transaction mode
		// without prepared-statement support (PgBouncer before 1.21, or
		// without max_prepared_statements) hands the session's server
		// connections to others between transactions, where a cached
		// statement is missing or exists already (26000, 42P05). The
		// descriptions are cached, so each statement still takes one
		// round trip. bench measures what a service's default pool does.
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	pin = pin && !setsSearchPath(cfg.ConnConfig.RuntimeParams)
	if pin {
		cfg.ConnConfig.RuntimeParams["search_path"] = pinnedSearchPath
	}
	pool, err := e.openPool(ctx, cfg)
	if pin && err != nil && strings.Contains(err.Error(), "unsupported startup parameter") {
		delete(cfg.ConnConfig.RuntimeParams, "search_path")
		if pool, err = e.openPool(ctx, cfg); err == nil {
			fmt.Fprintf(e.stderr, "annals: note: the server (a pooler) refused search_path as a start-up parameter: "+
				"this session keeps its default search_path (PgBouncer 1.20 or later: add search_path to track_extra_parameters; "+
				"before 1.20: ALTER ROLE ... SET search_path = pg_catalog, pg_temp; see docs/operations.md, \"PgBouncer and other poolers\")\n")
		}
		return pool, err
	}
	if pin && err == nil {
		// A pooler told to ignore the parameter drops it silently.
		var path string
		if qerr := pool.QueryRow(ctx, "SELECT pg_catalog.current_setting('search_path')").Scan(&path); qerr != nil {
			pool.Close()
			return nil, errors.Wrap(qerr, "read the session's search_path")
		}
		if path != pinnedSearchPath {
			fmt.Fprintf(e.stderr, "annals: note: this session's search_path is %q, not the %q the command sent at start-up "+
				"(a pooler dropped it: PgBouncer with search_path in ignore_startup_parameters; see docs/operations.md, "+
				"\"PgBouncer and other poolers\")\n", path, pinnedSearchPath)
		}
	}
	return pool, err
}

// setsSearchPath reports whether the connection's start-up parameters set
// the search_path: as a parameter of its own (pgx takes a URL's unknown
// query parameters as such), or in options (-c search_path=…, the libpq
// way: a URL's options, PGOPTIONS), which a search_path parameter beside it
// would override, since the server applies options first.
func setsSearchPath(params map[string]string) bool {
	if _, ok := params["search_path"]; ok {
		return true
	}
	return strings.Contains(strings.ReplaceAll(strings.ToLower(params["options"]), "-", "_"), "search_path")
}

// openPool opens a pool with cfg and makes one connection.
func (e *env) openPool(ctx context.Context, cfg *pgxpool.Config) (*pgxpool.Pool, error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, errors.Wrap(err, "connect")
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, errors.Wrapf(err, "connect to %s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	}
	return pool, nil
}
