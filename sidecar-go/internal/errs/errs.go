// Package errs holds the typed errors of joblease.errors: each says what happened
// and maps to one exit code and one HTTP status.
package errs

import (
	"errors"
	"fmt"

	"github.com/joblease/joblease/sidecar-go/internal/pyjson"
)

// Error is a protocol error: a stable reason word, the exit code and HTTP
// status it maps to, and structured details, exactly as joblease.errors
// defines them, so "stale" means the same thing in both implementations.
type Error struct {
	Reason   string
	ExitCode int
	Status   int
	Message  string
	Details  pyjson.Obj
	// Kind tells apart errors that share a reason (unknown vs unavailable).
	Kind Kind
	// Revision: for Held, the etcd revision at which the holder was seen (0:
	// unknown); a waiter watches the holder key from the next one
	// (protocol.Client.WaitForHolderChange). Not part of the body, as in Python.
	Revision int64
}

// Kind is the error's class (the Python exception class it stands for).
type Kind int

const (
	KindError Kind = iota
	KindInvalid
	KindNotRegistered
	KindHeld
	KindCompleted
	KindExhausted
	KindStale
	KindLost
	KindUnavailable
	KindOutcomeUnknown
	KindForbidden
	KindCorrupt
	KindLeaseNotFound
	KindClaimOutcomeUnknown
	KindSuspended
	KindConflict
	KindFull
)

func (e *Error) Error() string { return e.Message }

// Body is the error as JSON: {"error", "message", details...}.
func (e *Error) Body() pyjson.Obj {
	return append(pyjson.Obj{{Key: "error", Value: e.Reason}, {Key: "message", Value: e.Message}}, e.Details...)
}

// As finds the protocol error in err's chain (errors wrapped with %w
// included): the *Error and true, or nil and false.
func As(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e, true
	}
	return nil, false
}

// Is reports whether err (or an error it wraps) is a protocol error of one
// of the kinds.
func Is(err error, kinds ...Kind) bool {
	e, ok := As(err)
	if !ok {
		return false
	}
	for _, k := range kinds {
		if e.Kind == k {
			return true
		}
	}
	return false
}

func newErr(kind Kind, reason string, exit, status int, msg string, details pyjson.Obj) *Error {
	return &Error{Reason: reason, ExitCode: exit, Status: status, Message: msg, Details: details, Kind: kind}
}

func Generic(msg string) *Error { return newErr(KindError, "error", 1, 500, msg, nil) }

func Invalid(msg string) *Error { return newErr(KindInvalid, "invalid", 2, 400, msg, nil) }

func NotRegistered(job string) *Error {
	return newErr(KindNotRegistered, "not_found", 3, 404, fmt.Sprintf("job %s is not registered", job),
		pyjson.Obj{{Key: "job", Value: job}})
}

// QueueNotFound is a NotRegistered for a queue with no spec (QueueNotFoundError).
func QueueNotFound(queue string) *Error {
	return newErr(KindNotRegistered, "not_found", 3, 404, fmt.Sprintf("queue %s does not exist", queue),
		pyjson.Obj{{Key: "queue", Value: queue}})
}

// ItemNotFound is a NotRegistered for an id never enqueued (ItemNotFoundError).
func ItemNotFound(item string) *Error {
	return newErr(KindNotRegistered, "not_found", 3, 404,
		fmt.Sprintf("item %s was never enqueued (or its queue was deleted)", item), pyjson.Obj{{Key: "item", Value: item}})
}

// Suspended: the queue's spec says suspend (QueueSuspendedError). Revision is
// the one the spec was read at: a waiter watches the spec from the next one.
func Suspended(queue string, revision int64) *Error {
	e := newErr(KindSuspended, "suspended", 17, 409,
		fmt.Sprintf("queue %s is suspended: no item is claimed until it is resumed", queue), pyjson.Obj{{Key: "queue", Value: queue}})
	e.Revision = revision
	return e
}

// Conflict: an enqueue named an id stored with another payload (ConflictError).
func Conflict(queue, item string) *Error {
	return newErr(KindConflict, "conflict", 16, 409,
		fmt.Sprintf("item %s of queue %s is already enqueued with another payload; re-enqueueing an id must repeat "+
			"its payload (nothing of this batch was written)", PyRepr(item), queue),
		pyjson.Obj{{Key: "queue", Value: queue}, {Key: "item", Value: item}})
}

// SemaphoreNotFound is a NotRegistered for a semaphore with no spec
// (SemaphoreNotFoundError): a claim needs slots of it.
func SemaphoreNotFound(semaphore string) *Error {
	return newErr(KindNotRegistered, "not_found", 3, 404, fmt.Sprintf("semaphore %s does not exist", semaphore),
		pyjson.Obj{{Key: "semaphore", Value: semaphore}})
}

// SemaphoreFull: no room (SemaphoreFullError); the live slots, or the claims
// waiting ahead, leave fewer free slots than the claim needs. Nothing was
// written. Revision is the read's: a waiter watches the semaphores from the next one.
func SemaphoreFull(semaphore, job string, limit, live, waiters, weight, revision int64) *Error {
	e := newErr(KindFull, "full", 18, 409,
		fmt.Sprintf("semaphore %s has no room for %s (%d slot(s)): %d of %d slots live, %d claim(s) waiting",
			semaphore, job, weight, live, limit, waiters),
		pyjson.Obj{{Key: "semaphore", Value: semaphore}, {Key: "job", Value: job}, {Key: "limit", Value: limit},
			{Key: "live", Value: live}, {Key: "waiters", Value: waiters}, {Key: "weight", Value: weight}})
	e.Revision = revision
	return e
}

func Held(job, owner string, token, generation, revision int64) *Error {
	e := newErr(KindHeld, "held", 4, 409,
		fmt.Sprintf("job %s is held by %s (generation %d, token %d)", job, PyRepr(owner), generation, token),
		pyjson.Obj{{Key: "job", Value: job}, {Key: "owner", Value: owner}, {Key: "token", Value: token},
			{Key: "generation", Value: generation}})
	e.Revision = revision
	return e
}

func AlreadyCompleted(job, owner string, token, generation int64) *Error {
	return newErr(KindCompleted, "completed", 5, 409,
		fmt.Sprintf("job %s was already completed by %s (generation %d, token %d)", job, PyRepr(owner), generation, token),
		pyjson.Obj{{Key: "job", Value: job}, {Key: "owner", Value: owner}, {Key: "token", Value: token},
			{Key: "generation", Value: generation}})
}

func AttemptsExhausted(job string, attempts, max int64) *Error {
	return newErr(KindExhausted, "exhausted", 6, 409,
		fmt.Sprintf("job %s has used %d of %d attempts", job, attempts, max),
		pyjson.Obj{{Key: "job", Value: job}, {Key: "attempts", Value: attempts}, {Key: "maxAttempts", Value: max}})
}

// ClaimRevoked: our own claim used the last attempt but was ended by the revoke
// that settled its unknown outcome (an AttemptsExhausted, exit 6).
func ClaimRevoked(job string, token, generation, max int64) *Error {
	e := AttemptsExhausted(job, generation, max)
	e.Message = fmt.Sprintf("job %s has used %d of %d attempts: the last one was this client's own claim "+
		"(token %d), which committed while its unknown outcome was being settled and was ended by "+
		"revoking its etcd lease before anyone could use it", job, generation, max, token)
	e.Details = append(e.Details, pyjson.KV{Key: "token", Value: token}, pyjson.KV{Key: "generation", Value: generation},
		pyjson.KV{Key: "revokedWhileSettling", Value: true})
	return e
}

// Stale: the caller's token is no longer current. current is 0 when nobody holds the job.
func Stale(job string, token int64, current int64, currentOwner string, detail string) *Error {
	now := "nobody holds the job now"
	var cur, owner any
	if current != 0 {
		now = fmt.Sprintf("current token is %d held by %s", current, PyReprOpt(currentOwner))
		cur = current
	}
	if currentOwner != "" {
		owner = currentOwner
	}
	msg := fmt.Sprintf("stale token for job %s: your token %d is no longer current; %s", job, token, now)
	if detail != "" {
		msg += " (" + detail + ")"
	}
	e := newErr(KindStale, "stale", 7, 409, msg,
		pyjson.Obj{{Key: "job", Value: job}, {Key: "token", Value: token}, {Key: "currentToken", Value: cur},
			{Key: "currentOwner", Value: owner}})
	return e
}

// CurrentToken of a Stale error (0: nobody).
func (e *Error) CurrentToken() int64 {
	for _, kv := range e.Details {
		if kv.Key == "currentToken" {
			if v, ok := kv.Value.(int64); ok {
				return v
			}
		}
	}
	return 0
}

func Lost(job string, token int64, why string) *Error {
	return newErr(KindLost, "lost", 8, 409, fmt.Sprintf("lease on job %s with token %d is lost: %s", job, token, why),
		pyjson.Obj{{Key: "job", Value: job}, {Key: "token", Value: token}, {Key: "why", Value: why}})
}

func Unavailable(msg string) *Error { return newErr(KindUnavailable, "unavailable", 10, 503, msg, nil) }

func OutcomeUnknown(msg string) *Error {
	return newErr(KindOutcomeUnknown, "unknown", 11, 503, msg, nil)
}

func ClaimOutcomeUnknown(job, claimID string, leaseID int64, revoked bool, ttl int64, why string) *Error {
	ended := fmt.Sprintf("its etcd lease %x is no longer renewed and expires within its TTL (%ds)", leaseID, ttl)
	if revoked {
		ended = fmt.Sprintf("its etcd lease %x was revoked, so no holder of it remains", leaseID)
	}
	return newErr(KindClaimOutcomeUnknown, "unknown", 11, 503,
		fmt.Sprintf("claim of %s (claim id %s) has an unknown outcome: it may have committed and used an attempt (%s); %s",
			job, claimID, why, ended),
		pyjson.Obj{{Key: "job", Value: job}, {Key: "claimId", Value: claimID}, {Key: "leaseId", Value: leaseID},
			{Key: "leaseRevoked", Value: revoked}, {Key: "ttl", Value: ttl}, {Key: "why", Value: why}})
}

func Forbidden(msg string) *Error { return newErr(KindForbidden, "forbidden", 12, 403, msg, nil) }

func Corrupt(record, why string) *Error {
	return newErr(KindCorrupt, "corrupt", 14, 500, fmt.Sprintf("stored %s record cannot be decoded: %s", record, why),
		pyjson.Obj{{Key: "record", Value: record}, {Key: "why", Value: why}})
}

func LeaseNotFound(msg string) *Error {
	return newErr(KindLeaseNotFound, "lease_not_found", 1, 500, msg, nil)
}

// PyRepr quotes a string as Python's repr does for printable ASCII text
// (messages name owners this way: 'pod-a/123').
func PyRepr(s string) string {
	q := "'"
	if containsRune(s, '\'') && !containsRune(s, '"') {
		q = "\""
	}
	out := q
	for _, r := range s {
		switch {
		case r == '\\':
			out += `\\`
		case string(r) == q:
			out += `\` + q
		case r == '\n':
			out += `\n`
		case r == '\r':
			out += `\r`
		case r == '\t':
			out += `\t`
		case r < 0x20 || r == 0x7f:
			out += fmt.Sprintf(`\x%02x`, r)
		default:
			out += string(r)
		}
	}
	return out + q
}

// PyReprOpt is PyRepr, or None for the empty string.
func PyReprOpt(s string) string {
	if s == "" {
		return "None"
	}
	return PyRepr(s)
}

func containsRune(s string, r rune) bool {
	for _, c := range s {
		if c == r {
			return true
		}
	}
	return false
}
