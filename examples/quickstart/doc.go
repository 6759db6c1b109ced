// Command quickstart is annals in one file: it appends events to two
// account streams (optimistic concurrency included), keeps a balances read
// model with a projection, and reads the log back.
//
//	DATABASE_URL=postgres://… go run ./examples/quickstart
//
// or, with a throwaway local PostgreSQL: make demo. Account names carry a
// random run suffix, so it can run again on the same database.
package main
