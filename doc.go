// Package annals holds what every part of annals shares and a handler needs
// without importing the machinery: the Permanent error marker.
//
// The framework itself lives in the sub-packages:
//
//	eventstore   append and read events, typed registry
//	migrations   create and upgrade the schema
//	projection   projections and observers, the Runner
//	catchup      the subscription engine under the Runner
//	checkpoint   checkpoints with fencing epochs
//	advisorylock md5-keyed leader election
//	deadletter   inspect and act on dead letters
//	annalstest   test harness
//
// See README.md and docs/ for the guarantees and operations.
package annals
