package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/relay"
	"github.com/annals-dev/annals/relay/natsconsumer"
)

// The shop's events.
type OrderPlaced struct {
	Item  string `json:"item"`
	Total int    `json:"total"`
}

type OrderShipped struct {
	Carrier string `json:"carrier"`
}

func registry() *eventstore.Registry {
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[OrderPlaced](reg, "shop.order.placed")
	eventstore.MustRegister[OrderShipped](reg, "shop.order.shipped")
	return reg
}

const relayName = "relay-demo"

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	var err error
	if len(os.Args) == 4 && os.Args[1] == "consumer" {
		err = consume(ctx, os.Args[2], os.Args[3])
	} else {
		err = run(ctx, os.Stdout)
	}
	if err != nil {
		log.Fatalf("relay demo: %v", err)
	}
}

func run(ctx context.Context, out io.Writer) error {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return errors.New("set DATABASE_URL (or run it under `go run ./cmd/annals dev -- …`, which starts a throwaway PostgreSQL)")
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrations.Up(ctx, pool, nil); err != nil {
		return err
	}
	store, err := eventstore.New(pool, &eventstore.Config{Registry: registry()})
	if err != nil {
		return err
	}

	// 1. A real NATS server with JetStream, embedded in this process.
	dir, err := os.MkdirTemp("", "annals-relay-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		return err
	}
	go ns.Start()
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	if !ns.ReadyForConnections(10 * time.Second) {
		return errors.New("the NATS server did not start within 10s")
	}
	fmt.Fprintf(out, "NATS server with JetStream at %s\n", ns.ClientURL())
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return err
	}
	defer nc.Close()

	// 2. The relay: shop.* events, from the head of the log on (a demo
	//    database may hold other demos' events), into stream SHOP.
	cps, err := checkpoint.New("")
	if err != nil {
		return err
	}
	head, err := store.Head(ctx)
	if err != nil {
		return err
	}
	if _, err := cps.Set(ctx, pool, relayName, 0, head); err != nil {
		return err
	}
	r, err := relay.New(pool, nc, &relay.Config{Name: relayName, Types: []string{"shop.*"}, Prefix: "shop", Stream: "SHOP"})
	if err != nil {
		return err
	}
	if head > 0 {
		fmt.Fprintf(out, "the relay starts at the head, position %d, on purpose: it warns (below) that the earlier events are not in its new stream\n", head)
	}
	if _, err := r.EnsureStream(ctx); err != nil {
		return err
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	relayDone := make(chan error, 1)
	go func() { relayDone <- r.Run(relayCtx) }()
	fmt.Fprintf(out, "relay %q publishing shop.* events to stream SHOP on subjects %s\n", relayName, r.SubjectFilter())

	// 3. The consumer, a second process: this program again.
	const events = 5
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	consumer := exec.CommandContext(ctx, exe, "consumer", ns.ClientURL(), strconv.Itoa(events))
	consumer.Stdout, consumer.Stderr = os.Stdout, os.Stderr
	if err := consumer.Start(); err != nil {
		return err
	}
	fmt.Fprintf(out, "consumer started (pid %d)\n\n", consumer.Process.Pid)

	// 4. Append: two orders, one shipped, and an event the relay filters out.
	//    The order streams carry a run suffix, as the other demos' streams
	//    do: the database may hold streams of these names already (deleted
	//    ones too), and the demo can run again on it.
	md := eventstore.Metadata{CorrelationID: "checkout-42"}
	suffix := runID()
	order := func(n int) string { return fmt.Sprintf("order-%s-%d", suffix, n) }
	appends := []struct {
		stream string
		data   any
	}{
		{order(1), OrderPlaced{Item: "teapot", Total: 35}},
		{order(2), OrderPlaced{Item: "kettle", Total: 60}},
		{order(1), OrderShipped{Carrier: "post"}},
		{order(3), OrderPlaced{Item: "cups", Total: 12}},
		{order(2), OrderShipped{Carrier: "courier"}},
	}
	for _, a := range appends {
		res, err := store.Append(ctx, a.stream, eventstore.Any, eventstore.EventData{Data: a.data, Metadata: md})
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "appended  %-18s position %d  %s v%d  -> subject shop.%s.%s\n", typeName(a.data), res.Events[0].GlobalSequence,
			a.stream, res.Events[0].StreamVersion, relay.EscapeToken(typeName(a.data)), relay.EscapeToken(a.stream))
	}
	if _, err := store.Append(ctx, "audit-"+suffix, eventstore.Any, eventstore.EventData{Type: "audit.noted", Data: map[string]string{"note": "not relayed"}}); err != nil {
		return err
	}

	// 5. The consumer exits once it has read every event.
	if err := consumer.Wait(); err != nil {
		return errors.Wrap(err, "the consumer failed")
	}
	stopRelay()
	if err := <-relayDone; err != nil {
		return err
	}
	cp, err := cps.Load(ctx, pool, relayName, 0)
	if err != nil {
		return err
	}
	// The JetStream server is new on every run, while the database may hold
	// events of earlier runs and other demos: the relay began at the head.
	fmt.Fprintf(out, "\nrelay checkpoint at position %d: the shop.* events after position %d (the head when the relay began) "+
		"up to it are in this run's JetStream stream SHOP, each once\n", cp.Position, head)
	return nil
}

// runID is a random suffix that keeps this run's streams apart from those
// of earlier runs and other programs.
func runID() string {
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func typeName(v any) string {
	if n, ok := registry().NameOf(v); ok {
		return n
	}
	return fmt.Sprintf("%T", v)
}

// consume is the second process: it reads n relayed events from a durable
// JetStream consumer, decodes them with the registry, prints them, exits.
func consume(ctx context.Context, natsURL, count string) error {
	n, err := strconv.Atoi(count)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	reg := registry()
	c, err := natsconsumer.New(ctx, nc, &natsconsumer.Config{Stream: "SHOP", Durable: "shipping", Registry: reg})
	if err != nil {
		return err
	}
	cctx, done := context.WithCancel(ctx)
	defer done()
	got := 0
	err = c.Run(cctx, func(_ context.Context, e eventstore.Event) error {
		v, err := reg.Decode(e)
		if err != nil {
			return err
		}
		fmt.Printf("  consumer pid %d <- %-18s position %d  %s v%d  %+v  (correlation %s)\n",
			os.Getpid(), e.Type, e.GlobalSequence, e.StreamID, e.StreamVersion, v, e.Metadata.CorrelationID)
		if got++; got == n {
			done()
		}
		return nil
	})
	if err != nil {
		return err
	}
	if got < n {
		return errors.Newf("read %d of %d events before the deadline", got, n)
	}
	return nil
}
