package cli

import (
	"fmt"
	"io"

	"github.com/annals-dev/annals/walsource"
)

// writeSlotsTable appends the replication slots to the status table, when
// there are any.
func writeSlotsTable(w io.Writer, slots []walsource.SlotStatus) {
	if len(slots) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "REPLICATION SLOT\tSTATE\tCONFIRMED\tRETAINED WAL\tWAL STATUS")
	for _, s := range slots {
		state := "inactive (retaining WAL)"
		switch {
		case s.Active && s.ConfirmedFlushLSN == "":
			// Being created: PostgreSQL waits for the transactions that
			// were running when the creation began (an old open one
			// holds it up) before the slot has a consistent start.
			state = fmt.Sprintf("creating (pid %d; waits for the transactions open when it began)", s.ActivePID)
		case s.Active:
			state = fmt.Sprintf("streaming (pid %d)", s.ActivePID)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", s.Slot, state, s.ConfirmedFlushLSN, formatBytes(s.RetainedBytes), s.WALStatus)
	}
}

func formatBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
