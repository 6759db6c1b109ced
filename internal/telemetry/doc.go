// Package telemetry creates the OpenTelemetry tracer and instruments annals
// reports through, and carries W3C trace context in event metadata, so that
// a handler's span can link to the append that produced its event.
//
// Names follow the OpenTelemetry semantic-convention style:
//
//	annals.append.duration           histogram, s       append round trip
//	annals.append.events             counter, {event}   events appended
//	annals.batch.duration            histogram, s       one batch: handler calls and, for projections, its transaction (subscriber, outcome)
//	annals.subscription.events       counter, {event}   events a subscriber handled or dead-lettered, added per batch
//	annals.handler.duration          histogram, s       one handler call (subscriber, outcome); only with Config.HandlerSpans
//	annals.subscription.lag          gauge, {event}     head - checkpoint of a led partition
//	annals.subscription.lag_time     gauge, s           age of its oldest unprocessed event
//	annals.subscription.leader       gauge, 1           1 while this process leads the partition
//	annals.subscription.retries      counter, {retry}   failed attempts that will be retried
//	annals.subscription.dead_letters counter, {event}   dead letters written (reason failed|parked)
//	annals.listener.reconnects       counter, {reconnect}
//
// The duration histograms are in seconds with explicit bucket boundaries from
// 0.5 ms to 10 s; the SDK's default boundaries are meant for milliseconds.
//
// Spans: annals.append (producer) per append; annals.batch (consumer) per
// batch a subscriber processes; with the runner's HandlerSpans option also
// annals.handle <type> (consumer) per handler call, linked to the append's
// span. Per-event spans and records are opt-in because even with no-op
// providers they cost catch-up throughput (docs/benchmarks.md).
//
// Attributes: annals.subscriber, annals.partition, annals.reason,
// annals.outcome (ok|error).
package telemetry
