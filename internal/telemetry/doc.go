// Package telemetry creates the OpenTelemetry tracer and instruments annals
// reports through, and carries W3C trace context in event metadata, so that
// a handler's span can link to the append that produced its event.
//
// Names follow the OpenTelemetry semantic-convention style:
//
//	annals.append.duration           histogram, s       append round trip
//	annals.append.events             counter, {event}   events appended
//	annals.handler.duration          histogram, s       one handler call (subscriber, outcome)
//	annals.subscription.lag          gauge, {event}     head - checkpoint of a led partition
//	annals.subscription.lag_time     gauge, s           age of its oldest unprocessed event
//	annals.subscription.leader       gauge, 1           1 while this process leads the partition
//	annals.subscription.retries      counter, {retry}   failed attempts that will be retried
//	annals.subscription.dead_letters counter, {event}   dead letters written (reason failed|parked)
//	annals.listener.reconnects       counter, {reconnect}
//
// Attributes: annals.subscriber, annals.partition, annals.reason,
// annals.outcome (ok|error).
package telemetry
