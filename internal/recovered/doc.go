// Package recovered turns a panic in user code (a handler, a setup, a
// task's Event func) into an error, so that the failure of one piece of a
// user's code is that piece's failed attempt, retried or dead-lettered like
// an error it returned, instead of ending the process or the loop that
// called it.
package recovered
