// Package natsserver runs a real NATS server with JetStream inside the
// process (github.com/nats-io/nats-server/v2 as a library), for the relay's
// tests, benchmarks and demo: no Docker, no binary to install.
package natsserver
