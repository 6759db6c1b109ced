// Command relay measures package walsource and package relay against their
// baselines, each pair in the same run on the same database:
//
//   - wake: append -> handler latency (p50/p99) of a live observer woken by
//     NOTIFY and by its WAL slot, at a steady rate; and append throughput
//     (8 writers, single-event appends, as fast as they go) with the stock
//     append (which NOTIFYs) and with a copy of append_batch without the
//     pg_notify (what appends could drop when every consumer follows the WAL).
//
//   - relay: events/s into JetStream, acknowledged, of relay.CatchUp over a
//     backlog, against a raw JetStream publisher of the same messages
//     (PublishMsgAsync with the same headers, waiting for every ack per
//     window of the relay's batch size); and append -> JetStream consumer
//     latency (p50/p99) with the relay woken by NOTIFY and by the WAL.
//
//     go run ./cmd/annals dev -- go run ./bench/relay
//
// It uses the schema "annals_bench_relay" of DATABASE_URL's database (dropped
// and recreated) and an embedded NATS server with JetStream on a temporary
// directory.
package main
