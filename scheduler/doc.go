// Package scheduler appends events later: timers (one delayed append, e.g.
// a saga's timeout) and cron tasks (an event at every tick of a cron
// expression), each fired exactly once cluster-wide however many processes
// run a dispatcher.
//
// See New, Schedule and AddTask; docs/scheduler.md is the user guide.
package scheduler
