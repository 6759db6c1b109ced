// Command bank is a small event-sourced bank service built on annals: an
// Account aggregate (open, deposit, withdraw, never below zero), a
// transactional read model of balances (the bank.balances projection), an
// observer that notifies large withdrawals, and the projections commands
// for operators (package projectioncmd, mounted in this binary because a
// rebuild needs the service's projection code).
//
//	bank [demo]                          run the demo end to end (the default)
//	bank projections list                each projection's checkpoint, head, lag and leader
//	bank projections status [NAME]       the same per partition, with stops and dead letters
//	bank projections rebuild NAME --yes  rebuild a read model from the log, live
//
// It uses the database at DATABASE_URL (demo and rebuild migrate the annals
// schema first; list and status only read), or run it with a throwaway
// PostgreSQL: make demo.
//
// Files: account.go (events and aggregate), balances.go (the projection), notify.go (the observer), service.go (wiring),
// demo.go (the demo), main.go (commands).
package main
