package eventstore

// Position returns the position of the append's last event (0 when it has
// none): what read-your-writes waits for, e.g. annals.Client.Await or
// projection.Await.
func (r AppendResult) Position() int64 {
	if len(r.Events) == 0 {
		return 0
	}
	return r.Events[len(r.Events)-1].GlobalSequence
}
