package eventstore

import (
	"container/list"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/internal/errmark"
	"github.com/annals-dev/annals/internal/pgtx"
	"github.com/annals-dev/annals/internal/sqltmpl"
)

//go:embed personal.sql
var personalSQL string

// Default bounds of the data key cache (Config.KeyCacheSize, KeyCacheTTL).
const (
	DefaultKeyCacheSize = 1000
	DefaultKeyCacheTTL  = time.Minute
)

var (
	// ErrKeyUnwrap is matched when a subject's data key cannot be unwrapped
	// by the KeyEncrypter: a wrong key-encryption key, or a damaged row.
	ErrKeyUnwrap = errors.New("cannot unwrap data key")

	// ErrDecrypt is matched when a personal field cannot be decrypted with
	// its subject's (unwrapped) data key: the ciphertext was altered or moved.
	ErrDecrypt = errors.New("cannot decrypt personal field")

	// ErrNoKEK is matched by an append of an event type with personal data
	// (PersonalData) through a Store configured without a KEK: annals never
	// stores personal fields in clear. Decode matches it too when an event
	// read without a KEK still has encrypted personal fields and so does
	// not fit its type.
	ErrNoKEK = errors.New("personal data needs a key-encryption key (Config.KEK)")

	// ErrSubjectForgotten is matched by an append of personal data of a
	// subject that was forgotten (Forget): its key is gone for good.
	ErrSubjectForgotten = errors.New("subject is forgotten")

	// ErrKeyMissing is matched by a read of personal data whose subject has
	// no row in personal_keys at all. Forget keeps a row (without the key)
	// for every subject it forgets, and an append makes the row before the
	// event, so a missing row is damage (a partial restore, a row deleted
	// by hand), not an erasure: the fields are not shown as forgotten.
	ErrKeyMissing = errors.New("no data key is stored for the subject, and it was never forgotten")
)

// KeyEncrypter wraps and unwraps the per-subject data keys with a
// key-encryption key (KEK) the application holds; the database stores only
// wrapped keys. NewLocalKEK is the default implementation; a KMS client can
// implement it (Wrap: encrypt, Unwrap: decrypt, binding subject as context
// if the KMS supports it). Both must be safe for concurrent use.
type KeyEncrypter interface {
	// Wrap returns dataKey encrypted for subject.
	Wrap(ctx context.Context, subject string, dataKey []byte) ([]byte, error)
	// Unwrap returns the data key Wrap encrypted for subject, or an error
	// (annals marks it ErrKeyUnwrap) when wrapped was not made by this KEK
	// for this subject.
	Unwrap(ctx context.Context, subject string, wrapped []byte) ([]byte, error)
}

// NewLocalKEK returns a KeyEncrypter that wraps data keys with AES-256-GCM
// under key, which must be 32 bytes (keep it out of the database: a secret
// store, an environment variable). Each wrap has a random nonce and binds the
// subject as additional data, so a wrapped key moved to another subject's
// row does not unwrap.
func NewLocalKEK(key []byte) (KeyEncrypter, error) {
	if len(key) != 32 {
		return nil, errors.Newf("eventstore: a local KEK is 32 bytes (AES-256), got %d", len(key))
	}
	aead, err := newAEAD(key)
	if err != nil {
		return nil, err
	}
	return localKEK{aead: aead}, nil
}

type localKEK struct{ aead cipher.AEAD }

func kekAAD(subject string) []byte { return []byte("annals-kek-v1\x00" + subject) }

func (l localKEK) Wrap(_ context.Context, subject string, dataKey []byte) ([]byte, error) {
	return sealGCM(l.aead, dataKey, kekAAD(subject))
}

func (l localKEK) Unwrap(_ context.Context, subject string, wrapped []byte) ([]byte, error) {
	n := l.aead.NonceSize()
	if len(wrapped) < n {
		return nil, errors.Wrapf(ErrKeyUnwrap, "wrapped key of %q is %d bytes", subject, len(wrapped))
	}
	key, err := l.aead.Open(nil, wrapped[:n], wrapped[n:], kekAAD(subject))
	if err != nil {
		return nil, errors.Wrapf(ErrKeyUnwrap, "data key of %q: %v", subject, err)
	}
	return key, nil
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, errors.Wrap(err, "eventstore: AES key")
	}
	return cipher.NewGCM(block)
}

// sealGCM returns nonce || ciphertext of plain, with a random nonce.
func sealGCM(aead cipher.AEAD, plain, aad []byte) ([]byte, error) {
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(plain)+aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, errors.Wrap(err, "eventstore: nonce")
	}
	return aead.Seal(nonce, nonce, plain, aad), nil
}

// sealGCMFor returns nonce || ciphertext of plain with a nonce derived
// from nonceKey, the event ID, the field and plain (a synthetic IV): the
// same field of the same event sealed twice gives the same bytes, so an
// idempotent re-append of an event with caller-chosen ID finds its stored
// copy equal. Two different plaintexts get different nonces (but for
// HMAC-SHA-256 collisions in 96 bits, as likely as random nonces
// colliding), so GCM never sees a nonce twice with different input; and as
// the event ID goes in, equal values in different events do not seal
// alike.
func sealGCMFor(aead cipher.AEAD, nonceKey []byte, id [16]byte, field string, plain, aad []byte) []byte {
	mac := hmac.New(sha256.New, nonceKey)
	mac.Write(id[:])
	mac.Write([]byte(field))
	mac.Write([]byte{0})
	mac.Write(plain)
	sum := mac.Sum(nil)
	n := aead.NonceSize()
	nonce := make([]byte, n, n+len(plain)+aead.Overhead())
	copy(nonce, sum[:n])
	return aead.Seal(nonce, nonce, plain, aad)
}

// nonceKeyOf derives the key of sealGCMFor's nonces from a data key: HMAC
// with a label of its own, so it is not the encryption key.
func nonceKeyOf(dataKey []byte) []byte {
	mac := hmac.New(sha256.New, dataKey)
	mac.Write([]byte("annals-pd-nonce-v1"))
	return mac.Sum(nil)
}

// subjectKey is what the keyring knows of a subject.
type subjectKey struct {
	aead      cipher.AEAD // nil when forgotten, absent, or without a KEK
	nonceKey  []byte      // with aead: the key of the nonces of sealGCMFor
	forgotten bool        // the key is destroyed (Forget)
	at        time.Time   // when it was looked up (the cache's TTL)
}

// keyring looks up, creates and caches the data keys of subjects. The
// cache is an LRU of at most size subjects whose entries live at most ttl:
// a subject forgotten through another process is decrypted here for at most
// ttl after its Forget.
type keyring struct {
	kek  KeyEncrypter // nil: reads redact forgotten subjects, leave others encrypted
	pool *pgxpool.Pool
	q    struct{ keyOf, createKey, forget string }
	size int
	ttl  time.Duration
	now  func() time.Time

	mu  sync.Mutex
	lru *list.List // of *cacheEntry, most recent first
	m   map[string]*list.Element
}

type cacheEntry struct {
	subject string
	key     subjectKey
}

func newKeyring(pool *pgxpool.Pool, schema string, kek KeyEncrypter, size int, ttl time.Duration) (*keyring, error) {
	named, err := sqltmpl.Named("personal.sql", personalSQL, sqltmpl.NewData(schema))
	if err != nil {
		return nil, err
	}
	if size < 0 || ttl < 0 {
		return nil, errors.New("eventstore: KeyCacheSize and KeyCacheTTL must not be negative")
	}
	if size == 0 {
		size = DefaultKeyCacheSize
	}
	if ttl == 0 {
		ttl = DefaultKeyCacheTTL
	}
	k := &keyring{kek: kek, pool: pool, size: size, ttl: ttl, now: time.Now, lru: list.New(), m: map[string]*list.Element{}}
	k.q.keyOf, k.q.createKey, k.q.forget = named["KeyOf"], named["CreateKey"], named["Forget"]
	return k, nil
}

// cached returns subject's fresh cache entry.
func (k *keyring) cached(subject string) (subjectKey, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	el, ok := k.m[subject]
	if !ok {
		return subjectKey{}, false
	}
	ent := el.Value.(*cacheEntry)
	if k.now().Sub(ent.key.at) >= k.ttl {
		k.lru.Remove(el)
		delete(k.m, subject)
		return subjectKey{}, false
	}
	k.lru.MoveToFront(el)
	return ent.key, true
}

func (k *keyring) put(subject string, key subjectKey) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if el, ok := k.m[subject]; ok {
		el.Value.(*cacheEntry).key = key
		k.lru.MoveToFront(el)
		return
	}
	k.m[subject] = k.lru.PushFront(&cacheEntry{subject: subject, key: key})
	for k.lru.Len() > k.size {
		old := k.lru.Back()
		k.lru.Remove(old)
		delete(k.m, old.Value.(*cacheEntry).subject)
	}
}

// cacheLen is the number of cached subjects (tests).
func (k *keyring) cacheLen() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}

// lookup returns subject's key; with create, a subject without a key row
// gets one (a random data key, wrapped by the KEK).
func (k *keyring) lookup(ctx context.Context, subject string, create bool) (subjectKey, error) {
	if key, ok := k.cached(subject); ok && (key.aead != nil || key.forgotten || !create) {
		return key, nil
	}
	wrapped, forgotten, found, err := k.read(ctx, subject)
	if err != nil {
		return subjectKey{}, err
	}
	if !found && create {
		if k.kek == nil {
			return subjectKey{}, errors.WithStack(ErrNoKEK)
		}
		dk := make([]byte, 32)
		if _, err := rand.Read(dk); err != nil {
			return subjectKey{}, errors.Wrap(err, "eventstore: data key")
		}
		w, err := k.kek.Wrap(ctx, subject, dk)
		if err != nil {
			return subjectKey{}, errors.Wrapf(err, "eventstore: wrap data key of %q", subject)
		}
		if _, err := k.pool.Exec(ctx, k.q.createKey, subject, w); err != nil {
			return subjectKey{}, errors.Wrapf(err, "eventstore: store data key of %q", subject)
		}
		// Another process may have won the insert: use whatever is stored.
		if wrapped, forgotten, found, err = k.read(ctx, subject); err != nil {
			return subjectKey{}, err
		}
	}
	key := subjectKey{at: k.now()}
	switch {
	case !found:
		// Not cached: the row may be restored.
		return subjectKey{}, errors.Wrapf(ErrKeyMissing, "eventstore: subject %q", subject)
	case forgotten:
		// No key, so nothing can ever decrypt the subject's fields.
		key.forgotten = true
	case k.kek != nil:
		dk, err := k.kek.Unwrap(ctx, subject, wrapped)
		if err != nil {
			return subjectKey{}, errmark.Mark(errors.Wrapf(err, "eventstore: unwrap data key of %q", subject), ErrKeyUnwrap)
		}
		if key.aead, err = newAEAD(dk); err != nil {
			return subjectKey{}, errmark.Mark(err, ErrKeyUnwrap)
		}
		key.nonceKey = nonceKeyOf(dk)
	}
	k.put(subject, key)
	return key, nil
}

func (k *keyring) read(ctx context.Context, subject string) (wrapped []byte, forgotten, found bool, err error) {
	err = k.pool.QueryRow(ctx, k.q.keyOf, subject).Scan(&wrapped, &forgotten)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, false, nil
	}
	if err != nil {
		return nil, false, false, errors.Wrapf(err, "eventstore: read data key of %q", subject)
	}
	return wrapped, forgotten, true, nil
}

// ForgetResult is what Forget did.
type ForgetResult struct {
	// Subject is the forgotten subject.
	Subject string `json:"subject"`
	// HadKey is false when the subject had no key (never had personal data
	// appended, or was forgotten before): Forget still leaves a tombstone.
	HadKey bool `json:"had_key"`
	// SnapshotsDeleted counts the deleted snapshots of streams holding the
	// subject's personal data.
	SnapshotsDeleted int64 `json:"snapshots_deleted"`
}

// Forget crypto-shreds subject: its data key is destroyed (the row keeps
// only a tombstone with forgotten_at), and the snapshots of every stream
// holding an event with its personal data are deleted. The events stay in
// the log with their positions; from now on their personal fields read as
// redacted values (see PersonalData) in every read, decode, aggregate load,
// projection and rebuild; appends of new personal data of subject are
// refused (ErrSubjectForgotten). Forgetting a subject twice, or one never
// seen, is not an error. Another process's key cache may still decrypt the
// subject's fields for up to its KeyCacheTTL. Forget needs no KEK. Its cost
// follows the events of the streams that have snapshots (it reads those to
// find the subject's), not the size of the log.
func (s *Store) Forget(ctx context.Context, subject string) (ForgetResult, error) {
	res := ForgetResult{Subject: subject}
	if subject == "" {
		return res, invalidf("subject is empty")
	}
	// forget_subject refuses REPEATABLE READ and SERIALIZABLE (its delete
	// must see the snapshots committed while it waited for the forget
	// lock): READ COMMITTED whatever the role's or database's
	// default_transaction_isolation.
	err := pgx.BeginTxFunc(ctx, s.keys.pool, pgtx.ReadCommitted, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, s.keys.q.forget, subject).Scan(&res.HadKey, &res.SnapshotsDeleted)
	})
	if err != nil {
		return res, errors.Wrapf(translate(err, "", Any), "eventstore: forget %q", subject)
	}
	s.keys.put(subject, subjectKey{forgotten: true, at: s.keys.now()})
	if k := s.registry.keys.Load(); k != nil && k != s.keys {
		k.put(subject, subjectKey{forgotten: true, at: k.now()})
	}
	return res, nil
}
