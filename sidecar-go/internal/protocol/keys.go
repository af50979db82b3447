// Package protocol is joblease's protocol core (docs/protocol.md) in Go: the
// key layout, the stored records, the claim, renew, complete, release and
// checkpoint transactions, and read-back after unknown outcomes. It speaks to
// etcd only through the etcd package and knows nothing of HTTP or Kubernetes.
package protocol

import (
	"fmt"
	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"regexp"
	"strings"
)

// DefaultRoot is the key root when JOBLEASE_ROOT is not set.
const DefaultRoot = "/joblease/v1"

// JobRef is a job's identity: the namespace and name of its JobLease.
type JobRef struct{ Namespace, Name string }

func (j JobRef) String() string { return j.Namespace + "/" + j.Name }

// ParseJobRef reads "ns/name" or "name" (in defaultNamespace).
func ParseJobRef(text, defaultNamespace string) JobRef {
	if ns, name, ok := strings.Cut(text, "/"); ok {
		return JobRef{ns, name}
	}
	return JobRef{defaultNamespace, text}
}

// JobKeys are the etcd keys of one job, <root>/<namespace>/<name>/<field>,
// or of one queue item (docs/queues.md, "Key layout"): an item is a job of
// its queue, so the claim, the lease and its completion use the same keys by
// the same names; each item field lives under its own sub-prefix of the queue
// (<queue prefix><field>/<id>) so a queue's counts are count-only ranges.
type JobKeys struct {
	// Prefix is a job's own prefix; for an item, its queue's.
	Prefix string
	// ItemID is "" for a job.
	ItemID string
}

func (k JobKeys) field(job, item string) string {
	if k.ItemID == "" {
		return k.Prefix + job
	}
	return k.Prefix + item + "/" + k.ItemID
}

// Spec is the job's spec, or an item's queue's spec (what its claim compares).
func (k JobKeys) Spec() string       { return k.Prefix + "spec" }
func (k JobKeys) Holder() string     { return k.field("holder", "held") }
func (k JobKeys) Claims() string     { return k.field("claims", "claims") }
func (k JobKeys) Result() string     { return k.field("result", "results") }
func (k JobKeys) Checkpoint() string { return k.field("checkpoint", "checkpoints") }

// Item, Pending and Failed exist for queue items only.
func (k JobKeys) Item() string    { return k.field("", "items") }
func (k JobKeys) Pending() string { return k.field("", "pending") }
func (k JobKeys) Failed() string  { return k.field("", "failed") }

// IsItem: these are a queue item's keys.
func (k JobKeys) IsItem() bool { return k.ItemID != "" }

// HistorySegment is the path segment under a namespace that holds its jobs'
// tenure histories (docs/protocol.md, "Tenure history").
const HistorySegment = "_history"

// GenerationDigits: generations in tenure keys are zero-padded so that key
// order is claim order.
const GenerationDigits = 12

// History is the job's tenure history prefix, <root>/<ns>/_history/<name>/,
// or a queue item's, <queue prefix>history/<id>/ (docs/history.md, "Queue
// items": the same layout, under the queue, so it goes with the item's prune
// and the queue's delete and under no field prefix a count reads).
func (k JobKeys) History() string {
	if k.IsItem() {
		return k.Prefix + "history/" + k.ItemID + "/"
	}
	trimmed := strings.TrimSuffix(k.Prefix, "/")
	i := strings.LastIndex(trimmed, "/")
	return trimmed[:i+1] + HistorySegment + "/" + trimmed[i+1:] + "/"
}

// Tenure is the key of generation g's tenure in the job's history.
func (k JobKeys) Tenure(g int64) string {
	return k.History() + fmt.Sprintf("%0*d", GenerationDigits, g)
}

// completionDeletes: what the completion transaction deletes besides writing
// the result; a completed item leaves its queue's pending set at once.
func (k JobKeys) completionDeletes() []string {
	if k.IsItem() {
		return []string{k.Holder(), k.Pending()}
	}
	return []string{k.Holder()}
}

// QueuesSegment is the path segment under a namespace that holds its queues
// (no JobLease can be named so: Kubernetes names have no '_').
const QueuesSegment = "_queues"

// QueueRef is a queue's identity: the namespace and name of its JobQueue.
type QueueRef struct{ Namespace, Name string }

func (q QueueRef) String() string { return q.Namespace + "/" + q.Name }

// ItemRef is one item of a queue.
type ItemRef struct {
	Queue QueueRef
	ID    string
}

// String is "ns/queue/id", as Python's str(ItemRef): the name errors give the item.
func (i ItemRef) String() string { return i.Queue.String() + "/" + i.ID }

// QueueKeys are a queue's keys: Prefix is <root>/<ns>/_queues/<queue>/.
type QueueKeys struct{ Prefix string }

func (k QueueKeys) Spec() string { return k.Prefix + "spec" }

// FieldPrefix is items/, pending/, held/, claims/, results/, checkpoints/, failed/ or history/ under the queue.
func (k QueueKeys) FieldPrefix(field string) string { return k.Prefix + field + "/" }

// Item is the keys of one item of the queue.
func (k QueueKeys) Item(id string) JobKeys { return JobKeys{Prefix: k.Prefix, ItemID: id} }

// QueueKeysOf maps a queue to its keys under root (normalised as Keys does).
func QueueKeysOf(root string, q QueueRef) QueueKeys {
	root = "/" + strings.Trim(root, "/")
	return QueueKeys{Prefix: root + "/" + q.Namespace + "/" + QueuesSegment + "/" + q.Name + "/"}
}

// ParseQueueRef reads "ns/queue" or "queue" (in defaultNamespace).
func ParseQueueRef(text, defaultNamespace string) QueueRef {
	j := ParseJobRef(text, defaultNamespace)
	return QueueRef{j.Namespace, j.Name}
}

// Keys maps a job to its keys under root (normalised like KeySpace: one
// leading slash, no trailing one).
func Keys(root string, job JobRef) JobKeys {
	root = "/" + strings.Trim(root, "/")
	return JobKeys{Prefix: root + "/" + job.Namespace + "/" + job.Name + "/"}
}

// Input limits and naming rules (joblease.validation).
const (
	MaxResultBytes     = 64 * 1024
	MaxCheckpointBytes = MaxResultBytes
	MaxOwnerLength     = 253
	MaxPayloadBytes    = 64 * 1024
)

var (
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	dnsLabel     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	ownerRe      = regexp.MustCompile(`^[\x21-\x7e]+$`)
)

// ValidateJob applies Kubernetes naming: namespace a DNS label, name a DNS subdomain.
func ValidateJob(j JobRef) error {
	if !(len(j.Namespace) > 0 && len(j.Namespace) <= 63 && dnsLabel.MatchString(j.Namespace)) {
		return errs.Invalid("invalid namespace " + errs.PyRepr(j.Namespace) + ": must be a DNS label " +
			"(lowercase letters, digits and '-', at most 63 characters)")
	}
	if !(len(j.Name) > 0 && len(j.Name) <= 253 && dnsSubdomain.MatchString(j.Name)) {
		return errs.Invalid("invalid job name " + errs.PyRepr(j.Name) + ": must be a DNS subdomain " +
			"(lowercase letters, digits, '-' and '.', at most 253 characters)")
	}
	return nil
}

// itemIDRe with ValidateItemID's length check: `{1,253}` would compile 253
// copies of the class, 0.5 ms of every sidecar's start (package init).
var itemIDRe = regexp.MustCompile(`^[A-Za-z0-9._:-]+$`)

// ValidateQueue: a queue is named as a JobLease is.
func ValidateQueue(q QueueRef) error { return ValidateJob(JobRef{q.Namespace, q.Name}) }

// ValidateItemID: 1 to 253 characters of A-Z a-z 0-9 . _ : - (ids are key
// segments, so never a '/'; a CronJob's RFC 3339 slot time and an Indexed
// Job's index are ids as they are).
func ValidateItemID(id string) error {
	if len(id) > 253 || !itemIDRe.MatchString(id) {
		return errs.Invalid("invalid item id " + errs.PyRepr(id) + ": must be 1 to 253 characters of letters, digits, " +
			"'.', '_', ':' and '-'")
	}
	return nil
}

// ValidateOwner: 1..253 characters of printable ASCII without spaces.
func ValidateOwner(owner string) error {
	if len(owner) == 0 || len(owner) > MaxOwnerLength {
		return errs.Invalid("invalid owner " + errs.PyRepr(owner) + ": must be 1..253 characters")
	}
	if !ownerRe.MatchString(owner) {
		return errs.Invalid("invalid owner " + errs.PyRepr(owner) + ": printable ASCII without spaces only")
	}
	return nil
}
