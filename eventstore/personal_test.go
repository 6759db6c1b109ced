package eventstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	stderrors "errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// CustomerRegistered carries personal data of CustomerID.
type CustomerRegistered struct {
	CustomerID string   `json:"customer_id"`
	Name       string   `json:"name" annals:"personal"`
	Email      string   `json:"email" annals:"personal"`
	Age        int      `json:"age" annals:"personal"`
	Tags       []string `json:"tags" annals:"personal"`
	Plan       string   `json:"plan"`
}

func newKEK(t testing.TB) eventstore.KeyEncrypter {
	t.Helper()
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	kek, err := eventstore.NewLocalKEK(key)
	if err != nil {
		t.Fatal(err)
	}
	return kek
}

func personalRegistry(t testing.TB) *eventstore.Registry {
	t.Helper()
	reg := eventstore.NewRegistry()
	if err := eventstore.Register[CustomerRegistered](reg, "customer.registered", eventstore.PersonalData("CustomerID")); err != nil {
		t.Fatal(err)
	}
	return reg
}

func personalStore(t testing.TB, db *annalstest.DB, kek eventstore.KeyEncrypter, cfg *eventstore.Config) *eventstore.Store {
	t.Helper()
	var c eventstore.Config
	if cfg != nil {
		c = *cfg
	}
	if c.Registry == nil {
		c.Registry = personalRegistry(t)
	}
	c.KEK = kek
	s, err := eventstore.New(db.Pool, &c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ada(id string) CustomerRegistered {
	return CustomerRegistered{CustomerID: id, Name: "Ada Lovelace " + id, Email: "ada-" + id + "@example.org", Age: 36, Tags: []string{"vip-" + id}, Plan: "gold"}
}

// storedData returns the stored JSON text of every event of stream.
func storedData(t *testing.T, db *annalstest.DB, stream string) string {
	t.Helper()
	var s string
	if err := db.Pool.QueryRow(t.Context(), `SELECT coalesce(string_agg(data::text, ' '), '') FROM annals.events WHERE stream_id = $1`, stream).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func readOne(t *testing.T, s *eventstore.Store, reg *eventstore.Registry, stream string) (CustomerRegistered, error) {
	t.Helper()
	events, err := collect(t, s.ReadStream(t.Context(), stream, 0))
	if err != nil {
		return CustomerRegistered{}, err
	}
	if len(events) != 1 {
		t.Fatalf("%s has %d events", stream, len(events))
	}
	env, err := eventstore.Decode[CustomerRegistered](reg, events[0])
	return env.Data, err
}

// TestPersonalRoundTrip: personal fields are stored encrypted (no byte of
// the plaintext in the row) and read back decrypted through ReadStream,
// ReadAll, Decode and Decode[T]; other fields stay in clear.
func TestPersonalRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	reg := personalRegistry(t)
	s := personalStore(t, db, newKEK(t), &eventstore.Config{Registry: reg})
	want := ada("c-1")
	if _, err := s.Append(ctx, "customer-c-1", eventstore.NoStream, eventstore.NewEvent(want)); err != nil {
		t.Fatal(err)
	}
	stored := storedData(t, db, "customer-c-1")
	// Long secrets cannot turn up in the ciphertext's base64 by chance;
	// short ones ("36", "vip-c-1") could, so every personal field is
	// checked to be stored as a $personal envelope instead.
	for _, secret := range []string{want.Name, want.Email} {
		if bytes.Contains([]byte(stored), []byte(secret)) {
			t.Errorf("the stored event holds %q in clear: %s", secret, stored)
		}
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(stored), &fields); err != nil {
		t.Fatalf("stored data %s: %v", stored, err)
	}
	for _, f := range []string{"name", "email", "age", "tags"} {
		var env map[string]json.RawMessage
		if err := json.Unmarshal(fields[f], &env); err != nil || env["$personal"] == nil || len(env) != 1 {
			t.Errorf("personal field %q is stored as %s, not as a $personal envelope", f, fields[f])
		}
	}
	if !bytes.Contains([]byte(stored), []byte(`"plan": "gold"`)) && !bytes.Contains([]byte(stored), []byte(`"plan":"gold"`)) {
		t.Errorf("the non-personal field is not stored in clear: %s", stored)
	}
	got, err := readOne(t, s, reg, "customer-c-1")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("read %+v, want %+v", got, want)
	}
	for e, err := range s.ReadAll(ctx, 0) {
		if err != nil {
			t.Fatal(err)
		}
		v, err := reg.Decode(e)
		if err != nil || fmt.Sprint(v) != fmt.Sprint(want) {
			t.Fatalf("ReadAll+Decode: %+v %v", v, err)
		}
	}
	// Each field has its own nonce: the same value twice encrypts differently.
	twin := want
	twin.Email = twin.Name
	if _, err := s.Append(ctx, "customer-c-1", eventstore.Any, eventstore.NewEvent(twin)); err != nil {
		t.Fatal(err)
	}
	var a, b string
	if err := db.Pool.QueryRow(ctx, `SELECT data->'name'->'$personal'->>'data', data->'email'->'$personal'->>'data' FROM annals.events WHERE stream_id = 'customer-c-1' AND stream_version = 2`).Scan(&a, &b); err != nil {
		t.Fatal(err)
	}
	if a == "" || a == b {
		t.Fatalf("two equal values encrypt to %q and %q", a, b)
	}
	// A ciphertext moved to another field does not decrypt.
	moved := eventstore.Event{Type: "customer.registered", Data: []byte(fmt.Sprintf(`{"customer_id":"c-1","name":{"$personal":{"v":1,"subject":"c-1","kind":"string","data":%q}}}`, b))}
	if _, err := reg.Decode(moved); !errors.Is(err, eventstore.ErrDecrypt) {
		t.Fatalf("a ciphertext moved from email to name: %v, want ErrDecrypt", err)
	}
}

// TestForget: after Forget the events keep their positions and read as the
// documented redacted values; other subjects are untouched; the subject's
// key row is a tombstone holding nothing of the key; new personal data of
// the subject is refused; forgetting twice is fine.
func TestForget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	reg := personalRegistry(t)
	s := personalStore(t, db, newKEK(t), &eventstore.Config{Registry: reg})
	for _, id := range []string{"c-1", "c-2"} {
		if _, err := s.Append(ctx, "customer-"+id, eventstore.NoStream, eventstore.NewEvent(ada(id))); err != nil {
			t.Fatal(err)
		}
	}
	before := mustHead(t, s)
	res, err := s.Forget(ctx, "c-1")
	if err != nil || !res.HadKey {
		t.Fatalf("Forget: %+v %v", res, err)
	}
	if h := mustHead(t, s); h != before {
		t.Fatalf("Forget moved the head from %d to %d", before, h)
	}
	got, err := readOne(t, s, reg, "customer-c-1")
	if err != nil {
		t.Fatal(err)
	}
	want := CustomerRegistered{CustomerID: "c-1", Name: eventstore.Forgotten, Email: eventstore.Forgotten, Plan: "gold"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after Forget read %+v, want %+v", got, want)
	}
	if got, err := readOne(t, s, reg, "customer-c-2"); err != nil || fmt.Sprint(got) != fmt.Sprint(ada("c-2")) {
		t.Fatalf("the other subject reads %+v %v", got, err)
	}
	// A fresh store (empty cache) sees the same.
	fresh := personalStore(t, db, newKEK(t), nil)
	if got, err := readOne(t, fresh, fresh.Registry(), "customer-c-1"); err != nil || got.Name != eventstore.Forgotten {
		t.Fatalf("a fresh store reads %+v %v", got, err)
	}
	var wrapped []byte
	var forgotten bool
	if err := db.Pool.QueryRow(ctx, `SELECT wrapped_key, forgotten_at IS NOT NULL FROM annals.personal_keys WHERE subject = 'c-1'`).Scan(&wrapped, &forgotten); err != nil || wrapped != nil || !forgotten {
		t.Fatalf("key row after Forget: %x forgotten=%v %v", wrapped, forgotten, err)
	}
	if _, err := s.Append(ctx, "customer-c-1", eventstore.Any, eventstore.NewEvent(ada("c-1"))); !errors.Is(err, eventstore.ErrSubjectForgotten) {
		t.Fatalf("append of a forgotten subject's data: %v, want ErrSubjectForgotten", err)
	}
	if _, err := fresh.Append(ctx, "customer-c-1", eventstore.Any, eventstore.NewEvent(ada("c-1"))); !errors.Is(err, eventstore.ErrSubjectForgotten) {
		t.Fatalf("append of a forgotten subject's data by another store: %v, want ErrSubjectForgotten", err)
	}
	if res, err := s.Forget(ctx, "c-1"); err != nil || res.HadKey {
		t.Fatalf("second Forget: %+v %v", res, err)
	}
	// A subject never seen gets a tombstone: its data can never be appended.
	if res, err := s.Forget(ctx, "c-never"); err != nil || res.HadKey {
		t.Fatalf("Forget of an unknown subject: %+v %v", res, err)
	}
	if _, err := s.Append(ctx, "customer-c-never", eventstore.Any, eventstore.NewEvent(ada("c-never"))); !errors.Is(err, eventstore.ErrSubjectForgotten) {
		t.Fatalf("append for a subject forgotten in advance: %v", err)
	}
	if _, err := s.Forget(ctx, ""); !errors.Is(err, eventstore.ErrInvalidEvent) {
		t.Fatalf("Forget(\"\"): %v", err)
	}
}

// TestForgetSeenByOtherProcessesWithinTTL: a store whose cache holds the
// key decrypts until its KeyCacheTTL runs out, then reads redacted.
func TestForgetSeenByOtherProcessesWithinTTL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	kek := newKEK(t)
	a := personalStore(t, db, kek, nil)
	b := personalStore(t, db, kek, &eventstore.Config{KeyCacheTTL: 200 * time.Millisecond})
	if _, err := a.Append(ctx, "customer-c-1", eventstore.NoStream, eventstore.NewEvent(ada("c-1"))); err != nil {
		t.Fatal(err)
	}
	if got, err := readOne(t, b, b.Registry(), "customer-c-1"); err != nil || got.Name != ada("c-1").Name {
		t.Fatalf("b reads %+v %v", got, err)
	}
	if _, err := a.Forget(ctx, "c-1"); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 10*time.Second, func() bool { // b reads the forgotten subject redacted
		got, err := readOne(t, b, b.Registry(), "customer-c-1")
		return err == nil && got.Name == eventstore.Forgotten && got.Email == eventstore.Forgotten
	})
}

// TestWrongKEK: a store with another key-encryption key fails reads with
// ErrKeyUnwrap, and so does its append for the same subject; nothing is
// redacted or written by mistake.
func TestWrongKEK(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	s := personalStore(t, db, newKEK(t), nil)
	if _, err := s.Append(ctx, "customer-c-1", eventstore.NoStream, eventstore.NewEvent(ada("c-1"))); err != nil {
		t.Fatal(err)
	}
	wrong := personalStore(t, db, newKEK(t), nil)
	if _, err := readOne(t, wrong, wrong.Registry(), "customer-c-1"); !errors.Is(err, eventstore.ErrKeyUnwrap) {
		t.Fatalf("read with a wrong KEK: %v, want ErrKeyUnwrap", err)
	}
	if _, err := wrong.Append(ctx, "customer-c-1", eventstore.Any, eventstore.NewEvent(ada("c-1"))); !errors.Is(err, eventstore.ErrKeyUnwrap) {
		t.Fatalf("append with a wrong KEK: %v, want ErrKeyUnwrap", err)
	}
	if v, _ := s.StreamVersion(ctx, "customer-c-1"); v != 1 {
		t.Fatalf("stream version %d after the refused append", v)
	}
	if _, err := eventstore.NewLocalKEK(make([]byte, 16)); err == nil {
		t.Fatal("a 16-byte local KEK was accepted")
	}
}

// TestNoKEK: without a KEK, appends of personal data are refused; reads
// leave the fields encrypted, except a forgotten subject's, redacted.
func TestNoKEK(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	s := personalStore(t, db, newKEK(t), nil)
	for _, id := range []string{"c-1", "c-2"} {
		if _, err := s.Append(ctx, "customer-"+id, eventstore.NoStream, eventstore.NewEvent(ada(id))); err != nil {
			t.Fatal(err)
		}
	}
	plain := personalStore(t, db, nil, nil)
	if _, err := plain.Append(ctx, "customer-c-3", eventstore.NoStream, eventstore.NewEvent(ada("c-3"))); !errors.Is(err, eventstore.ErrNoKEK) {
		t.Fatalf("append without a KEK: %v, want ErrNoKEK", err)
	}
	if _, err := plain.Forget(ctx, "c-1"); err != nil {
		t.Fatal(err)
	}
	for e, err := range plain.ReadAll(ctx, 0) {
		if err != nil {
			t.Fatal(err)
		}
		switch e.StreamID {
		case "customer-c-1":
			if !bytes.Contains(e.Data, []byte(`"name":"[forgotten]"`)) || !bytes.Contains(e.Data, []byte(`"age":null`)) {
				t.Errorf("forgotten subject read without a KEK: %s", e.Data)
			}
		case "customer-c-2":
			if !bytes.Contains(e.Data, []byte(`"$personal"`)) || bytes.Contains(e.Data, []byte("Ada")) {
				t.Errorf("live subject read without a KEK: %s", e.Data)
			}
			// Decoding it fails with an error the caller can match: the data
			// does not decode (ErrDecode), for want of a KEK.
			if _, err := eventstore.Decode[CustomerRegistered](plain.Registry(), e); !errors.Is(err, eventstore.ErrNoKEK) || !stderrors.Is(err, eventstore.ErrNoKEK) ||
				!errors.Is(err, eventstore.ErrDecode) || !stderrors.Is(err, eventstore.ErrDecode) {
				t.Errorf("Decode of encrypted personal data: %v, want ErrNoKEK and ErrDecode", err)
			}
			// So does the untyped Registry.Decode (untyped handlers use it).
			if _, err := plain.Registry().Decode(e); !errors.Is(err, eventstore.ErrNoKEK) || !errors.Is(err, eventstore.ErrDecode) {
				t.Errorf("Registry.Decode of encrypted personal data: %v, want ErrNoKEK and ErrDecode", err)
			}
		}
	}
}

// TestKeyCacheBound: the cache never holds more than KeyCacheSize subjects,
// and evicted keys are looked up again.
func TestKeyCacheBound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	reg := personalRegistry(t)
	s := personalStore(t, db, newKEK(t), &eventstore.Config{Registry: reg, KeyCacheSize: 5})
	for i := range 30 {
		id := fmt.Sprintf("c-%d", i)
		if _, err := s.Append(ctx, "customer-"+id, eventstore.NoStream, eventstore.NewEvent(ada(id))); err != nil {
			t.Fatal(err)
		}
		if n := eventstore.KeyCacheLen(s); n > 5 {
			t.Fatalf("after %d subjects the cache holds %d, over its bound 5", i+1, n)
		}
	}
	for i := range 30 {
		id := fmt.Sprintf("c-%d", i)
		if got, err := readOne(t, s, reg, "customer-"+id); err != nil || got.Email != ada(id).Email {
			t.Fatalf("read %s: %+v %v", id, got, err)
		}
	}
	if n := eventstore.KeyCacheLen(s); n != 5 {
		t.Fatalf("cache holds %d, want 5", n)
	}
	var keys int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.personal_keys`).Scan(&keys); err != nil || keys != 30 {
		t.Fatalf("%d key rows, want 30 (%v)", keys, err)
	}
}

// TestPersonalRegistration: bad declarations are refused at Register.
func TestPersonalRegistration(t *testing.T) {
	t.Parallel()
	type untagged struct {
		ID string `json:"id"`
	}
	type tagged struct {
		ID   string `json:"id"`
		Name string `json:"name" annals:"personal"`
	}
	type subjectTagged struct {
		ID string `json:"id" annals:"personal"`
	}
	type hidden struct {
		ID   string `json:"id"`
		Name string `json:"-" annals:"personal"`
	}
	// Tags that encrypt nothing: only top-level fields declared in the type
	// are encrypted, so a tag deeper down (or one misspelt) left the field
	// in clear with no word of it, and Forget did not reach it.
	type address struct {
		Street string `json:"street" annals:"personal"`
		City   string `json:"city"`
	}
	type nested struct {
		ID      string  `json:"id"`
		Address address `json:"address"`
	}
	type nestedPointer struct {
		ID        string     `json:"id"`
		Addresses []*address `json:"addresses"`
	}
	type nestedMap struct {
		ID        string             `json:"id"`
		Addresses map[string]address `json:"addresses"`
	}
	type Contact struct {
		Email string `json:"email" annals:"personal"`
	}
	type embedded struct {
		ID string `json:"id"`
		Contact
	}
	type misspelt struct {
		ID    string `json:"id"`
		Email string `json:"email" annals:"personal,omitempty"`
	}
	// node's children are nodes too: only the top-level node's Name is
	// encrypted, the children's are stored in clear.
	type node struct {
		ID       string  `json:"id"`
		Name     string  `json:"name" annals:"personal"`
		Children []*node `json:"children"`
	}
	type branch struct {
		Label string    `json:"label"`
		Kids  []*branch `json:"kids"`
	}
	type tree struct {
		ID   string  `json:"id"`
		Name string  `json:"name" annals:"personal"`
		Root *branch `json:"root"`
	}
	type wholeAddress struct {
		ID      string  `json:"id"`
		Address address `json:"address" annals:"personal"`
	}
	reg := eventstore.NewRegistry()
	for name, err := range map[string]error{
		"no subject":     eventstore.Register[tagged](reg, "a", nil...),
		"no tags":        eventstore.Register[untagged](reg, "b", eventstore.PersonalData("ID")),
		"subject tagged": eventstore.Register[subjectTagged](reg, "c", eventstore.PersonalData("ID")),
		"no such field":  eventstore.Register[tagged](reg, "d", eventstore.PersonalData("Nope")),
		"not encoded":    eventstore.Register[hidden](reg, "e", eventstore.PersonalData("ID")),
		"nested":         eventstore.Register[nested](reg, "f"),
		"nested with PD": eventstore.Register[nested](reg, "g", eventstore.PersonalData("ID")),
		"nested pointer": eventstore.Register[nestedPointer](reg, "h"),
		"nested map":     eventstore.Register[nestedMap](reg, "i"),
		"embedded":       eventstore.Register[embedded](reg, "j"),
		"embedded, PD":   eventstore.Register[embedded](reg, "k", eventstore.PersonalData("ID")),
		"misspelt":       eventstore.Register[misspelt](reg, "l"),
		"misspelt, PD":   eventstore.Register[misspelt](reg, "m", eventstore.PersonalData("ID")),
		"recursive":      eventstore.Register[node](reg, "n", eventstore.PersonalData("ID")),
	} {
		if !errors.Is(err, eventstore.ErrInvalidEvent) {
			t.Errorf("%s: %v, want ErrInvalidEvent", name, err)
		}
	}
	if err := eventstore.Register[nested](eventstore.NewRegistry(), "nested"); err == nil || !strings.Contains(err.Error(), "Address.Street") {
		t.Errorf("the refusal of a nested tag does not name the field: %v", err)
	}
	if err := eventstore.Register[tagged](reg, "ok", eventstore.PersonalData("ID")); err != nil {
		t.Fatal(err)
	}
	// A tag inside a field that is personal as a whole is redundant, not
	// misleading; a recursive type is walked once.
	if err := eventstore.Register[wholeAddress](reg, "ok2", eventstore.PersonalData("ID")); err != nil {
		t.Errorf("a nested tag inside a personal field: %v", err)
	}
	if err := eventstore.Register[tree](reg, "ok3", eventstore.PersonalData("ID")); err != nil {
		t.Errorf("a recursive type: %v", err)
	}
	if err := eventstore.Register[node](eventstore.NewRegistry(), "node", eventstore.PersonalData("ID")); err == nil || !strings.Contains(err.Error(), "Children.Name") {
		t.Errorf("the refusal of a recursive type's nested tag does not name the field: %v", err)
	}
}

// BenchmarkEncodePersonal: the client-side cost of encrypting 4 personal
// fields (key cached), against BenchmarkEncodePlain for the same payload
// registered without personal data.
func BenchmarkEncodePersonal(b *testing.B) {
	ctx := context.Background()
	db := annalstest.NewDB(b, nil)
	s := personalStore(b, db, newKEK(b), nil)
	ev := eventstore.NewEvent(ada("c-1"))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Encode(ctx, "customer-c-1", eventstore.Any, ev); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncodePlain is BenchmarkEncodePersonal without personal data.
func BenchmarkEncodePlain(b *testing.B) {
	ctx := context.Background()
	db := annalstest.NewDB(b, nil)
	s, err := eventstore.New(db.Pool, &eventstore.Config{Registry: eventstore.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	ev := eventstore.EventData{Type: "customer.plain", Data: ada("c-1")}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Encode(ctx, "customer-c-1", eventstore.Any, ev); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadDecodePersonal: decrypting and decoding one event with 4
// personal fields (key cached).
func BenchmarkReadDecodePersonal(b *testing.B) {
	ctx := context.Background()
	db := annalstest.NewDB(b, nil)
	reg := personalRegistry(b)
	s := personalStore(b, db, newKEK(b), &eventstore.Config{Registry: reg})
	if _, err := s.Append(ctx, "customer-c-1", eventstore.NoStream, eventstore.NewEvent(ada("c-1"))); err != nil {
		b.Fatal(err)
	}
	var stored eventstore.Event
	for e, err := range s.ReadAll(ctx, 0) {
		if err != nil {
			b.Fatal(err)
		}
		stored = e
	}
	if err := db.Pool.QueryRow(ctx, `SELECT data::text FROM annals.events WHERE stream_id = 'customer-c-1'`).Scan(&stored.Data); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := eventstore.Decode[CustomerRegistered](reg, stored); err != nil {
			b.Fatal(err)
		}
	}
}

// TestPersonalConcurrent: stores with caches of their own race to make the
// first key of one subject (one key wins; every event decrypts with it),
// then keep appending while the subject is forgotten: afterwards every
// event of the subject reads redacted, whichever key state the writer had
// cached, and no plaintext is stored.
func TestPersonalConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	kek := newKEK(t)
	const writers = 6
	stores := make([]*eventstore.Store, writers)
	for i := range stores {
		stores[i] = personalStore(t, db, kek, &eventstore.Config{KeyCacheTTL: 50 * time.Millisecond})
	}
	errs := make(chan error, writers)
	start := make(chan struct{})
	for i, s := range stores {
		go func() {
			<-start
			_, err := s.Append(ctx, fmt.Sprintf("customer-c-1-%d", i), eventstore.NoStream, eventstore.NewEvent(ada("c-1")))
			errs <- err
		}()
	}
	close(start)
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	var keys int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.personal_keys`).Scan(&keys); err != nil || keys != 1 {
		t.Fatalf("%d key rows (%v), want 1", keys, err)
	}
	for i, s := range stores {
		for e, err := range s.ReadAll(ctx, 0) {
			if err != nil {
				t.Fatalf("store %d: %v", i, err)
			}
			v, err := eventstore.Decode[CustomerRegistered](s.Registry(), e)
			if err != nil || v.Data.Name != ada("c-1").Name {
				t.Fatalf("store %d reads %+v %v", i, v.Data, err)
			}
		}
	}

	// Appends continue while the subject is forgotten.
	stop := make(chan struct{})
	done := make(chan int, writers)
	var appended atomic.Int64
	for i, s := range stores {
		go func() {
			n := 0
			for {
				select {
				case <-stop:
					done <- n
					return
				default:
				}
				_, err := s.Append(ctx, fmt.Sprintf("customer-c-1-%d", i), eventstore.Any, eventstore.NewEvent(ada("c-1")))
				switch {
				case err == nil:
					n++
					appended.Add(1)
				case errors.Is(err, eventstore.ErrSubjectForgotten):
				default:
					t.Error(err)
					done <- n
					return
				}
			}
		}()
	}
	annalstest.WaitFor(t, 10*time.Second, func() bool { return appended.Load() >= writers })
	if _, err := stores[0].Forget(ctx, "c-1"); err != nil {
		t.Fatal(err)
	}
	// Wait until every writer is refused (their caches expired), then stop.
	for i, s := range stores {
		annalstest.WaitFor(t, 10*time.Second, func() bool {
			_, err := s.Append(ctx, fmt.Sprintf("customer-c-1-%d", i), eventstore.Any, eventstore.NewEvent(ada("c-1")))
			return errors.Is(err, eventstore.ErrSubjectForgotten)
		})
	}
	close(stop)
	total := 0
	for range writers {
		total += <-done
	}
	t.Logf("%d appends during the race", total)
	fresh := personalStore(t, db, kek, nil)
	n := 0
	for e, err := range fresh.ReadAll(ctx, 0) {
		if err != nil {
			t.Fatal(err)
		}
		v, err := eventstore.Decode[CustomerRegistered](fresh.Registry(), e)
		if err != nil || v.Data.Name != eventstore.Forgotten || v.Data.Email != eventstore.Forgotten || v.Data.Age != 0 || v.Data.Tags != nil {
			t.Fatalf("event %d after Forget: %+v %v", e.GlobalSequence, v.Data, err)
		}
		n++
	}
	if n < writers {
		t.Fatalf("read %d events", n)
	}
	var leaked int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.events t WHERE t::text LIKE '%Ada Lovelace%'`).Scan(&leaked); err != nil || leaked != 0 {
		t.Fatalf("%d events hold the plaintext (%v)", leaked, err)
	}
}

// TestPersonalIdempotent: an append of personal data with a caller-chosen
// event ID can be retried like any other (a lone Append, a group, inside
// Transact, concurrently): the retry returns the stored position and writes
// nothing. A random nonce per field made every retry differ from the stored
// copy, and it failed with ErrEventIDConflict. The same ID with other
// personal content is still a conflict, and equal values in two events
// are not stored alike.
func TestPersonalIdempotent(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := annalstest.NewDB(t, nil)
	kek := newKEK(t)
	s := personalStore(t, db, kek, nil)
	id := uuid.Must(uuid.NewV7())
	ev := eventstore.EventData{ID: id, Data: ada("c-9")}
	first, err := s.Append(ctx, "customer-c-9", eventstore.NoStream, ev)
	if err != nil {
		t.Fatal(err)
	}
	same := func(what string, res eventstore.AppendResult, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if len(res.Events) != 1 || res.Events[0] != first.Events[0] {
			t.Fatalf("%s: %+v, want the stored %+v", what, res.Events, first.Events)
		}
	}
	res, err := s.Append(ctx, "customer-c-9", eventstore.NoStream, ev)
	same("retry with NoStream", res, err)
	res, err = s.Append(ctx, "customer-c-9", eventstore.Any, ev)
	same("retry with Any", res, err)
	// Another Store (another process): the key is read from the database.
	other := personalStore(t, db, kek, nil)
	res, err = other.Append(ctx, "customer-c-9", eventstore.Any, ev)
	same("retry from another store", res, err)
	results, err := s.Transact(ctx, func(ctx context.Context, tx pgx.Tx, b *eventstore.Batch) error {
		return b.Append("customer-c-9", eventstore.Any, ev)
	})
	if err == nil && len(results) != 1 {
		t.Fatalf("Transact returned %d results", len(results))
	}
	if err == nil {
		res = results[0]
	}
	same("retry in Transact", res, err)
	// Concurrent retries, through group commit.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := s.Append(ctx, "customer-c-9", eventstore.Any, ev)
			if err == nil && r.Events[0] != first.Events[0] {
				err = fmt.Errorf("position %+v", r.Events[0])
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent retry: %v", err)
		}
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.events WHERE stream_id = 'customer-c-9'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d events stored (%v), want 1", n, err)
	}
	// The same ID with other personal content is a conflict.
	changed := ada("c-9")
	changed.Email = "other@example.org"
	if _, err := s.Append(ctx, "customer-c-9", eventstore.Any, eventstore.EventData{ID: id, Data: changed}); !errors.Is(err, eventstore.ErrEventIDConflict) {
		t.Fatalf("same ID, other personal content: %v, want ErrEventIDConflict", err)
	}
	// Equal values in two events (two IDs) are sealed differently.
	for _, stream := range []string{"twin-1", "twin-2"} {
		if _, err := s.Append(ctx, stream, eventstore.NoStream, eventstore.EventData{ID: uuid.Must(uuid.NewV7()), Data: ada("c-10")}); err != nil {
			t.Fatal(err)
		}
	}
	if a, b := storedData(t, db, "twin-1"), storedData(t, db, "twin-2"); a == b {
		t.Fatalf("two events with equal personal data are stored alike: %s", a)
	}
	got, err := readOne(t, s, s.Registry(), "customer-c-9")
	if err != nil || !reflect.DeepEqual(got, ada("c-9")) {
		t.Fatalf("read back %+v, %v", got, err)
	}
}

// TestKeyRowMissing: personal data whose subject has no personal_keys row
// at all (a partial restore, a row deleted by hand) fails to read with
// ErrKeyMissing, with a KEK and without; it read as "[forgotten]", an
// erasure that never happened. A forgotten subject (whose row Forget
// keeps) still reads redacted, and the restored row makes it readable.
func TestKeyRowMissing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := annalstest.NewDB(t, nil)
	kek := newKEK(t)
	s := personalStore(t, db, kek, nil)
	for _, id := range []string{"c-1", "c-2"} {
		if _, err := s.Append(ctx, "customer-"+id, eventstore.NoStream, eventstore.NewEvent(ada(id))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Forget(ctx, "c-2"); err != nil {
		t.Fatal(err)
	}
	var saved []byte
	if err := db.Pool.QueryRow(ctx, `DELETE FROM annals.personal_keys WHERE subject = 'c-1' RETURNING wrapped_key`).Scan(&saved); err != nil {
		t.Fatal(err)
	}
	for name, st := range map[string]*eventstore.Store{"with a KEK": personalStore(t, db, kek, nil), "without": personalStore(t, db, nil, nil)} {
		if _, err := readOne(t, st, st.Registry(), "customer-c-1"); !errors.Is(err, eventstore.ErrKeyMissing) || !strings.Contains(err.Error(), `"c-1"`) {
			t.Errorf("%s: read of a subject without a key row: %v, want ErrKeyMissing naming c-1", name, err)
		}
		events, err := collect(t, st.ReadStream(ctx, "customer-c-2", 0))
		if err != nil || len(events) != 1 || !bytes.Contains(events[0].Data, []byte(`"name":"[forgotten]"`)) {
			t.Errorf("%s: forgotten subject: %v, %v", name, events, err)
		}
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO annals.personal_keys (subject, wrapped_key) VALUES ('c-1', $1)`, saved); err != nil {
		t.Fatal(err)
	}
	if got, err := readOne(t, personalStore(t, db, kek, nil), s.Registry(), "customer-c-1"); err != nil || !reflect.DeepEqual(got, ada("c-1")) {
		t.Fatalf("after the row is restored: %+v, %v", got, err)
	}
}

// PatientAdmitted has an integer subject; VisitorSeen a UUID one.
type PatientAdmitted struct {
	PatientID int64  `json:"patient_id"`
	Name      string `json:"name" annals:"personal"`
}

// ClubMemberJoined's integer subject is written as a JSON string.
type ClubMemberJoined struct {
	MemberID int64  `json:"member_id,string"`
	Name     string `json:"name" annals:"personal"`
}

type VisitorSeen struct {
	VisitorID uuid.UUID `json:"visitor_id"`
	Name      string    `json:"name" annals:"personal"`
}

// A subject that is its field's zero value ("", 0, the nil UUID: what an
// unset field holds) is refused, and nothing is written: it would put the
// personal data of every event whose field was left unset under one
// subject, so that forgetting one of them forgot all, and none alone. A 0
// was taken as subject "0" and the nil UUID as itself.
func TestPersonalZeroSubject(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[PatientAdmitted](reg, "patient.admitted", eventstore.PersonalData("PatientID"))
	eventstore.MustRegister[VisitorSeen](reg, "visitor.seen", eventstore.PersonalData("VisitorID"))
	eventstore.MustRegister[ClubMemberJoined](reg, "club.member.joined", eventstore.PersonalData("MemberID"))
	s := personalStore(t, db, newKEK(t), &eventstore.Config{Registry: reg})
	ctx := t.Context()
	for name, data := range map[string]any{
		"zero integer":                     PatientAdmitted{Name: "Ann"},
		"zero integer written as a string": ClubMemberJoined{Name: "Mo"},
		"nil UUID":                         VisitorSeen{Name: "Vic"},
		"zero as JSON":                     json.RawMessage(`{"patient_id": 0.0, "name": "Ann"}`),
		"missing field":                    json.RawMessage(`{"name": "Ann"}`),
	} {
		ev := eventstore.NewEvent(data)
		if raw, ok := data.(json.RawMessage); ok {
			ev = eventstore.EventData{Type: "patient.admitted", Data: raw}
		}
		_, err := s.Append(ctx, "zero-"+strings.ReplaceAll(name, " ", "-"), eventstore.Any, ev)
		var inv *eventstore.InvalidEventError
		if !errors.As(err, &inv) || !errors.Is(err, eventstore.ErrInvalidEvent) || !strings.Contains(err.Error(), "missing or empty") {
			t.Errorf("%s: %v, want an *InvalidEventError for the missing subject", name, err)
		}
	}
	if head, err := s.Head(ctx); err != nil || head != 0 {
		t.Fatalf("refused appends wrote %d events (%v)", head, err)
	}
	// Set subjects are taken, the number 10 among them (only zero is unset).
	for _, data := range []any{PatientAdmitted{PatientID: 10, Name: "Ann"}, PatientAdmitted{PatientID: -3, Name: "Bo"},
		VisitorSeen{VisitorID: uuid.New(), Name: "Vic"}, ClubMemberJoined{MemberID: 7, Name: "Mo"}} {
		if _, err := s.Append(ctx, "set", eventstore.Any, eventstore.NewEvent(data)); err != nil {
			t.Fatalf("%+v: %v", data, err)
		}
	}
}

// panicky's MarshalJSON panics on its zero value (a nil pointer), as a
// type's own encoder may.
type panicky struct {
	ID   string  `json:"id"`
	Name string  `json:"name" annals:"personal"`
	Plan *string `json:"plan"`
}

func (p panicky) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]string{"id": p.ID, "name": p.Name, "plan": *p.Plan})
}

// Registering a type whose encoder panics on its zero value does not
// panic: the zero value's subject is only looked for (to refuse it).
func TestPersonalRegistrationOfAPanickyEncoder(t *testing.T) {
	t.Parallel()
	reg := eventstore.NewRegistry()
	if err := eventstore.Register[panicky](reg, "panicky", eventstore.PersonalData("ID")); err != nil {
		t.Fatal(err)
	}
}
