// Package protocol is joblease's protocol core (docs/protocol.md) in Go: the
// key layout, the stored records, the claim, renew, complete, release and
// checkpoint transactions, and read-back after unknown outcomes. It speaks to
// etcd only through the etcd package and knows nothing of HTTP or Kubernetes.
package protocol

import (
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

// JobKeys are the etcd keys of one job: <root>/<namespace>/<name>/<field>.
type JobKeys struct{ Prefix string }

func (k JobKeys) Spec() string       { return k.Prefix + "spec" }
func (k JobKeys) Holder() string     { return k.Prefix + "holder" }
func (k JobKeys) Claims() string     { return k.Prefix + "claims" }
func (k JobKeys) Result() string     { return k.Prefix + "result" }
func (k JobKeys) Checkpoint() string { return k.Prefix + "checkpoint" }

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
