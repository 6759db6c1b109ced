// Command relay shows the NATS JetStream relay end to end: it starts a real
// NATS server inside this process (JetStream on a temporary directory), a
// relay publishing the log to it, and a consumer in a second process (this
// program again, as "consumer") that reads the relayed events back as
// eventstore.Event values; then it appends a few events and prints what
// crosses over. It exits by itself within seconds.
//
//	DATABASE_URL=postgres://… go run ./examples/relay
package main
