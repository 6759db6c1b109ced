package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/eventstore"
)

// forgetCommand is `annals forget SUBJECT`: crypto-shredding (see
// eventstore.Store.Forget).
func (e *env) forgetCommand() *cobra.Command {
	var yes bool
	var format *string
	cmd := &cobra.Command{
		Use:   "forget SUBJECT",
		Short: "Forget a person: destroy the data key of SUBJECT's personal data",
		Long: `Forget SUBJECT (the subject ID of event types registered with
eventstore.PersonalData): its data key is destroyed, leaving a tombstone, and the
snapshots of the streams holding its personal data are deleted. Every event stays in
the log at its position, but its personal fields can never be decrypted again: they
read as "[forgotten]" (strings) or null (other kinds) in 'annals read', in
applications' reads, aggregates, projections and rebuilds. New personal data of
SUBJECT is refused. Needs no key-encryption key. See docs/operations.md, "Forgetting
people".

It cannot be undone: on a terminal it asks for confirmation, otherwise pass --yes.
Forgetting a subject twice, or one never seen, succeeds (had_key false).
--output json writes {"subject", "had_key", "snapshots_deleted"}.`,
		Example: `  annals forget customer-8f3a --yes`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			subject := args[0]
			if subject == "" {
				return usagef("SUBJECT must not be empty")
			}
			if !yes {
				if err := e.confirmed(fmt.Sprintf("forget %q: its personal data can never be read again", subject), "nothing was forgotten"); err != nil {
					return err
				}
			}
			pool, err := e.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			store, err := eventstore.New(pool, &eventstore.Config{Schema: e.schema, GroupCommit: eventstore.GroupCommit{Disabled: true}})
			if err != nil {
				return err
			}
			res, err := store.Forget(cmd.Context(), subject)
			if err != nil {
				return err
			}
			if *format == outputJSON {
				return writeJSON(e.stdout, res)
			}
			if !res.HadKey {
				_, err = fmt.Fprintf(e.stdout, "%s forgotten (it had no data key: nothing was stored for it, or it was forgotten before); %s deleted\n", subject, countNoun(res.SnapshotsDeleted, "snapshot"))
				return err
			}
			_, err = fmt.Fprintf(e.stdout, "%s forgotten: data key destroyed, %s deleted\n", subject, countNoun(res.SnapshotsDeleted, "snapshot"))
			return err
		},
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation")
	format = addOutputFlag(cmd, false, outputText, outputJSON)
	return cmd
}
