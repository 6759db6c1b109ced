package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/annals-dev/annals/internal/plaintext"
)

const (
	sessionCookie = "annals_session"
	csrfCookie    = "annals_csrf"
	// sessionTTL is how long a token login lasts.
	sessionTTL = 12 * time.Hour
	csrfField  = "csrf"
)

func (c *Console) mac(parts ...string) string {
	h := hmac.New(sha256.New, c.secret)
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (c *Console) cookiePath(r *http.Request) string {
	return c.base(r) + "/"
}

// principal returns who makes r: the Authorizer's answer, else a bearer
// token, else a signed session cookie from a token login.
func (c *Console) principal(r *http.Request) (Principal, bool) {
	if c.cfg.Authorizer != nil {
		if p, ok := c.cfg.Authorizer(r); ok {
			return p, true
		}
	}
	if c.cfg.AuthToken == "" {
		return Principal{}, false
	}
	if tok, ok := bearer(r); ok {
		if c.tokenOK(tok) {
			name := r.Header.Get("X-Annals-Actor")
			if name == "" || len(name) > 100 || !actorOK(name) {
				name = "token"
			}
			return Principal{Name: name, Operator: true}, true
		}
		return Principal{}, false
	}
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return Principal{}, false
	}
	parts := strings.Split(ck.Value, ".")
	if len(parts) != 3 {
		return Principal{}, false
	}
	nameB, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil {
		return Principal{}, false
	}
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || c.cfg.Now().Unix() > exp {
		return Principal{}, false
	}
	if !hmac.Equal([]byte(parts[2]), []byte(c.mac("session", c.cfg.AuthToken, string(nameB), parts[1]))) {
		return Principal{}, false
	}
	return Principal{Name: string(nameB), Operator: true}, true
}

func (c *Console) tokenOK(t string) bool {
	a := sha256.Sum256([]byte(t))
	b := sha256.Sum256([]byte(c.cfg.AuthToken))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// csrfToken returns the CSRF token for r's browser, setting the cookie it is
// derived from when r has none.
func (c *Console) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) == 32 {
		return c.mac("csrf", ck.Value)
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	v := hex.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: v, Path: c.cookiePath(r), HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	// The request in hand renders forms with the new cookie's token.
	r.AddCookie(&http.Cookie{Name: csrfCookie, Value: v})
	return c.mac("csrf", v)
}

// csrfOK checks a write: a request with a valid bearer token carries
// no ambient credentials and needs no CSRF token; any other must come from
// this origin (when the browser says so) and carry the token in the form
// that matches its cookie.
func (c *Console) csrfOK(r *http.Request) bool {
	if tok, ok := bearer(r); c.cfg.AuthToken != "" && ok && c.tokenOK(tok) {
		return true
	}
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return false
		}
	}
	ck, err := r.Cookie(csrfCookie)
	if err != nil || len(ck.Value) != 32 {
		return false
	}
	got := r.PostFormValue(csrfField)
	return got != "" && hmac.Equal([]byte(got), []byte(c.mac("csrf", ck.Value)))
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if !c.csrfOK(r) {
		c.fail(w, r, http.StatusForbidden, "The form's CSRF token is missing or wrong: reload the page and try again.")
		return
	}
	if c.cfg.AuthToken == "" {
		c.fail(w, r, http.StatusForbidden, "Token login is off: this console was started without --auth-token.")
		return
	}
	name := strings.TrimSpace(r.PostFormValue("name"))
	if name == "" || len(name) > 100 || !actorOK(name) {
		c.fail(w, r, http.StatusBadRequest, "Give your name (1 to 100 characters, no control characters): the audit log records it with every action.")
		return
	}
	if !c.tokenOK(r.PostFormValue("token")) {
		c.fail(w, r, http.StatusUnauthorized, "Wrong token.")
		return
	}
	exp := strconv.FormatInt(c.cfg.Now().Add(sessionTTL).Unix(), 10)
	v := base64.RawURLEncoding.EncodeToString([]byte(name)) + "." + exp + "." + c.mac("session", c.cfg.AuthToken, name, exp)
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: v, Path: c.cookiePath(r), HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil, MaxAge: int(sessionTTL / time.Second)})
	http.Redirect(w, r, c.base(r)+"/", http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request, _ Principal) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: c.cookiePath(r), MaxAge: -1, HttpOnly: true})
	http.Redirect(w, r, c.base(r)+"/", http.StatusSeeOther)
}

// write wraps an action: it refuses it in read-only mode, without a valid
// CSRF token, without an operator principal, or when the database role
// lacks the operator privileges. action "" (logout) needs only the CSRF
// token.
func (c *Console) write(action string, fn func(http.ResponseWriter, *http.Request, Principal)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
		// A wrong bearer token is a failed sign-in, whatever else the
		// request lacks (it needs no CSRF token only when the token is
		// right): 401, not a CSRF refusal that would send a script's author
		// looking for a form token.
		if c.wrongBearer(r) {
			c.fail(w, r, http.StatusUnauthorized, "Wrong token (Authorization: Bearer): nothing was changed.")
			return
		}
		if !c.csrfOK(r) {
			c.fail(w, r, http.StatusForbidden, "The form's CSRF token is missing or wrong (or the request came from another site): nothing was changed. Reload the page and try again.")
			return
		}
		if action == "" {
			fn(w, r, Principal{})
			return
		}
		if c.cfg.ReadOnly {
			c.fail(w, r, http.StatusForbidden, "This console is read-only (--read-only): nothing was changed.")
			return
		}
		p, ok := c.principal(r)
		if !ok {
			c.fail(w, r, http.StatusUnauthorized, "Sign in as an operator to change anything: nothing was changed.")
			return
		}
		if !p.Operator || p.Name == "" {
			c.fail(w, r, http.StatusForbidden, "You are signed in but not as an operator: nothing was changed.")
			return
		}
		if !c.canOperate(r.Context()) {
			c.fail(w, r, http.StatusForbidden, "The console's database role lacks the operator privileges ('annals grant operator ROLE'): nothing was changed.")
			return
		}
		fn(w, r, p)
	}
}

// wrongBearer reports whether r presents an "Authorization: Bearer"
// header that neither the token (Config.AuthToken) nor the Authorizer
// accepts.
func (c *Console) wrongBearer(r *http.Request) bool {
	tok, ok := bearer(r)
	if !ok || (c.cfg.AuthToken != "" && c.tokenOK(tok)) {
		return false
	}
	if c.cfg.Authorizer != nil {
		if _, ok := c.cfg.Authorizer(r); ok {
			return false
		}
	}
	return true
}

// bearer returns the token of an "Authorization: Bearer TOKEN" header
// ("" for a header with the scheme alone); the scheme's name is
// case-insensitive (RFC 9110).
func bearer(r *http.Request) (string, bool) {
	scheme, tok, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimSpace(tok), true
}

// actorOK reports whether name may stand in the audit log as who acted:
// UTF-8 text without control or bidirectional formatting characters (a
// name with a line break would forge lines in an export of the log).
func actorOK(name string) bool {
	if !utf8.ValidString(name) {
		return false
	}
	for _, r := range name {
		if plaintext.Disguising(r) {
			return false
		}
	}
	return true
}
