package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"

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

// writeStandbysTable appends the physical standbys to the status output,
// when there are any. Names and addresses may be any text (textCell).
func writeStandbysTable(w *strings.Builder, standbys []StandbyStatus) {
	if len(standbys) == 0 {
		return
	}
	orDash := func(p *string) string {
		if p == nil || *p == "" {
			return "-"
		}
		return textCell(*p)
	}
	w.WriteString("\n")
	var tbl textTable
	tbl.add("STANDBY", "PID", "ADDRESS", "STATE", "SYNC", "REPLAY LAG", "REPLAY LAG TIME")
	hidden := false
	for _, s := range standbys {
		lag, lagTime := "-", "-"
		if s.ReplayLagBytes != nil {
			lag = formatBytes(*s.ReplayLagBytes)
		}
		if sec := s.LagSeconds(); sec != nil {
			lagTime = formatSeconds(*sec)
		}
		hidden = hidden || s.Hidden()
		tbl.add(orDash(s.ApplicationName), strconv.Itoa(int(s.PID)), orDash(s.ClientAddr), orDash(s.State), orDash(s.SyncState), lag, lagTime)
	}
	_ = tbl.write(w)
	if hidden {
		w.WriteString("A standby's details are hidden from this role: grant it pg_read_all_stats to see them.\n")
	}
}
