// Command archive measures archiving on a large log: append throughput,
// catch-up throughput and live-tail latency before and after archiving 90%
// of the log, the archive run's duration, and the tables' sizes. It uses the
// database at DATABASE_URL (migrated; run it in `annals dev`, fsync on):
//
//	go run ./cmd/annals dev -- go run ./bench/archive -events 10000000
//
// The log is loaded by a fast path fit for a benchmark only: one INSERT ...
// SELECT generate_series into events (as the schema's owner, bypassing
// append_events; 10,000 streams of events of about 60 bytes, random
// gen_random_uuid IDs), with streams and the position sequence set to
// match. Everything after the load goes through annals' API.
package main
