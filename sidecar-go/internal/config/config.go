// Package config reads the sidecar's settings from JOBLEASE_* environment
// variables and flags, exactly as joblease.sidecar.config and the click
// command do (docs/sidecar.md lists them): each flag overrides the variable
// of the same meaning; bad values are refused before anything runs.
package config

import (
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
	"github.com/joblease/joblease/sidecar-go/internal/etcd"
	"github.com/joblease/joblease/sidecar-go/internal/protocol"
)

const (
	DefaultPort      = 8470
	DefaultProbePort = 8471
	DefaultTokenFile = "/run/joblease/token"
	DefaultRateLimit = 50.0
	// DefaultCheckpointRate: bytes of checkpoints per second a sidecar writes at
	// most (docs/sidecar.md, "Rate limiting"). 16 KiB/s is 56 MiB an hour: what the
	// bundled etcd keeps of one job's checkpoints until its hourly compaction is
	// under 3 % of its 2 GiB quota.
	DefaultCheckpointRate = 16384.0
)

// Backoff is the claim retry backoff: exponential with equal jitter.
type Backoff struct{ Initial, Maximum, Multiplier float64 }

// Delay before retry attempt (0-based); rand in [0, 1).
func (b Backoff) Delay(attempt int, rand float64) float64 {
	base := math.Min(b.Maximum, b.Initial*math.Pow(b.Multiplier, float64(min(attempt, 32))))
	return base/2 + base/2*rand
}

// Config is everything the sidecar needs.
type Config struct {
	Job protocol.JobRef
	// Queue mode (docs/sidecar.md, "Queue mode"): Queue set instead of Job.
	// With Item, the sidecar claims that one item (created first with
	// ItemCreate: a CronJob slot); without, it drains the queue, one item
	// after another, and with ExitWhenEmpty ends with success once no item
	// is pending or held.
	Queue             *protocol.QueueRef
	Item              string
	ItemCreate        bool
	ExitWhenEmpty     bool
	Owner             string
	Etcd              etcd.Config
	Host              string
	Port              int
	PortFile          string
	ProbeHost         string
	ProbePort         int // -1: off
	ProbePortFile     string
	TokenFile         string // "": none
	OnLoss            string
	OnFinal           string
	WorkerPidFile     string
	WorkerProcessName string
	ReleaseOnTerm     bool
	APIToken          string
	MaxResultBytes    int
	Backoff           Backoff
	RegistrationWait  float64
	// LeaseTTL: the TTL the job's spec is expected to have (JOBLEASE_LEASE_TTL;
	// 0: not given), so the first lease is granted while the spec is read
	// (protocol.Client.LeaseTTLHint); a wrong one costs a second grant, never a claim.
	LeaseTTL         int64
	LossExitCode     int
	LogLevel         string
	RateLimit        float64 // 0: off
	RateLimitProblem string  // an unusable JOBLEASE_SIDECAR_RATE_LIMIT (logged; the default is used)
	// CheckpointRate: bytes of checkpoints per second (0: off); the problem as above
	CheckpointRate        float64
	CheckpointRateProblem string
}

// TokenJSONFile is token.json beside the token file.
func (c Config) TokenJSONFile() string {
	if c.TokenFile == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(c.TokenFile), filepath.Base(c.TokenFile)+".json")
}

// Loopback: the API listens on loopback only (the safe default).
func (c Config) Loopback() bool {
	if ip := net.ParseIP(c.Host); ip != nil {
		return ip.IsLoopback()
	}
	return c.Host == "localhost"
}

func parseBool(v, name string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes", "on":
		return true, nil
	case "0", "false", "no", "off", "":
		return false, nil
	}
	return false, errs.Invalid(fmt.Sprintf("%s: expected true/false, got %s", name, errs.PyRepr(v)))
}

func envFloat(env map[string]string, name string, def float64) (float64, error) {
	raw, ok := env[name]
	if !ok || strings.TrimSpace(raw) == "" {
		return def, nil
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(raw), 64)
	if err != nil {
		return 0, errs.Invalid(fmt.Sprintf("%s: expected a number, got %s", name, errs.PyRepr(raw)))
	}
	return f, nil
}

func envInt(env map[string]string, name string, def int) (int, error) {
	raw, ok := env[name]
	if !ok || strings.TrimSpace(raw) == "" {
		return def, nil
	}
	i, err := strconv.Atoi(strings.TrimSpace(raw))
	if err != nil {
		return 0, errs.Invalid(fmt.Sprintf("%s: expected an integer, got %s", name, errs.PyRepr(raw)))
	}
	return i, nil
}

// ReadSecret reads a mounted secret, without surrounding whitespace.
func ReadSecret(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		reason := err.Error()
		if pe, ok := err.(*os.PathError); ok {
			reason = pe.Err.Error()
		}
		return "", errs.Invalid(fmt.Sprintf("cannot read secret file %s: %s", path, reason))
	}
	v := strings.TrimSpace(string(data))
	if v == "" {
		return "", errs.Invalid(fmt.Sprintf("secret file %s is empty", path))
	}
	return v, nil
}

// Environ as a map.
func Environ() map[string]string {
	env := map[string]string{}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return env
}

func defaultOwner(env map[string]string) string {
	pod, uid := env["POD_NAME"], env["POD_UID"]
	if pod != "" && uid != "" {
		return pod + "/" + uid
	}
	if pod != "" {
		return pod
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/%d", host, os.Getpid())
}

// rateLimit is JOBLEASE_SIDECAR_RATE_LIMIT (requests/s) or
// JOBLEASE_SIDECAR_CHECKPOINT_RATE (bytes/s): 0 when disabled; an unusable value
// gives the default and a problem to log.
func rateLimit(env map[string]string, name string, def float64) (float64, string) {
	raw := strings.ToLower(strings.TrimSpace(env[name]))
	switch raw {
	case "":
		return def, ""
	case "0", "off", "none", "false":
		return 0, ""
	}
	v, err := strconv.ParseFloat(raw, 64)
	if err != nil || !(v > 0) || math.IsInf(v, 0) {
		return def, raw
	}
	return v, ""
}

func etcdFromEnv(env map[string]string) (etcd.Config, error) {
	password := env["JOBLEASE_ETCD_PASSWORD"]
	if password == "" && env["JOBLEASE_ETCD_PASSWORD_FILE"] != "" {
		data, err := os.ReadFile(env["JOBLEASE_ETCD_PASSWORD_FILE"])
		if err != nil {
			return etcd.Config{}, errs.Invalid(fmt.Sprintf("cannot read %s: %v", env["JOBLEASE_ETCD_PASSWORD_FILE"], err))
		}
		password = strings.TrimSpace(string(data))
	}
	username := env["JOBLEASE_ETCD_USERNAME"]
	if f := env["JOBLEASE_ETCD_USERNAME_FILE"]; f != "" {
		data, err := os.ReadFile(f)
		if err != nil {
			return etcd.Config{}, errs.Invalid(fmt.Sprintf("cannot read %s: %v", f, err))
		}
		username = strings.TrimSpace(string(data))
	}
	passwordFile := ""
	if env["JOBLEASE_ETCD_PASSWORD"] == "" {
		passwordFile = env["JOBLEASE_ETCD_PASSWORD_FILE"]
	}
	endpoints := []string{}
	raw, ok := env["JOBLEASE_ETCD_ENDPOINTS"]
	if !ok {
		raw = "127.0.0.1:2379"
	}
	for _, e := range strings.Split(raw, ",") {
		if e = strings.TrimSpace(e); e != "" {
			endpoints = append(endpoints, e)
		}
	}
	root, ok := env["JOBLEASE_ROOT"]
	if !ok {
		root = protocol.DefaultRoot
	}
	return etcd.Config{Endpoints: endpoints, CAFile: env["JOBLEASE_ETCD_CA_FILE"], CertFile: env["JOBLEASE_ETCD_CERT_FILE"],
		KeyFile: env["JOBLEASE_ETCD_KEY_FILE"], ServerName: env["JOBLEASE_ETCD_SERVER_NAME"],
		Username: username, Password: password, Root: root,
		UsernameFile: env["JOBLEASE_ETCD_USERNAME_FILE"], PasswordFile: passwordFile}, nil
}

// Usage is the flag list, as `joblease sidecar --help` documents it.
const Usage = `Usage: joblease-sidecar [OPTIONS]

  Claim this pod's job, keep it alive, serve the token to the worker.

Options:
  --job TEXT                      Job name [JOBLEASE_JOB_NAME]; 'ns/name' also sets the namespace.
  --namespace TEXT                Job or queue namespace [JOBLEASE_JOB_NAMESPACE].
  --queue TEXT                    Work on this queue instead of a job [JOBLEASE_QUEUE];
                                  'ns/queue' also sets the namespace.
  --item TEXT                     Queue mode: claim this one item, e.g. an Indexed Job's
                                  $JOB_COMPLETION_INDEX [JOBLEASE_ITEM]; unset: drain the queue.
  --item-create                   Queue mode: enqueue the item first if absent (a CronJob
                                  slot) [JOBLEASE_ITEM_CREATE; false].
  --exit-when-empty               Draining: end with success once no item is pending or
                                  held [JOBLEASE_EXIT_WHEN_EMPTY; false].
  --owner TEXT                    Owner identity [JOBLEASE_OWNER; default POD_NAME/POD_UID].
  --host TEXT                     API listen address [JOBLEASE_SIDECAR_HOST; 127.0.0.1].
  --port INTEGER                  API port, 0 = any [JOBLEASE_SIDECAR_PORT; 8470].
  --port-file FILE                Write the bound API port here [JOBLEASE_SIDECAR_PORT_FILE].
  --probe-host TEXT               Probe listener address [JOBLEASE_SIDECAR_PROBE_HOST; 0.0.0.0].
  --probe-port INTEGER            Probe port (-1 = off) [JOBLEASE_SIDECAR_PROBE_PORT; 8471].
  --probe-port-file FILE          Write the bound probe port here [JOBLEASE_SIDECAR_PROBE_PORT_FILE].
  --token-file FILE               Token file [JOBLEASE_TOKEN_FILE; /run/joblease/token].
  --on-loss [signal|exit|none]    Action on loss [JOBLEASE_SIDECAR_ON_LOSS; signal].
  --on-final [serve|exit]         On a final claim answer (already completed, refused for good):
                                  serve it or exit with its code [JOBLEASE_SIDECAR_ON_FINAL; serve].
  --worker-pid-file FILE          Worker pid file [JOBLEASE_WORKER_PID_FILE].
  --worker-process-name TEXT      Worker process name [JOBLEASE_WORKER_PROCESS_NAME].
  --release-on-term / --no-release-on-term
                                  Release the lease on SIGTERM [JOBLEASE_SIDECAR_RELEASE_ON_TERM; true].
  --api-token-file FILE           Bearer token file for the API [JOBLEASE_SIDECAR_API_TOKEN_FILE].
  --max-result-bytes INTEGER      Result size limit [JOBLEASE_SIDECAR_MAX_RESULT_BYTES; 65536].
  --claim-backoff-initial FLOAT   First claim retry delay, s [JOBLEASE_SIDECAR_CLAIM_BACKOFF_INITIAL; 0.2].
  --claim-backoff-max FLOAT       Longest claim retry delay, s [JOBLEASE_SIDECAR_CLAIM_BACKOFF_MAX; 5].
  --registration-wait FLOAT       Wait this long for registration, s [JOBLEASE_SIDECAR_REGISTRATION_WAIT; 30].
  --lease-ttl INTEGER             The job's TTL if known, s: the first lease is granted while the
                                  spec is read; a wrong one is corrected [JOBLEASE_LEASE_TTL].
  --log-level TEXT                Log level [JOBLEASE_LOG_LEVEL; INFO].
  --help                          Show this message and exit.
`

// ErrHelp: --help was given (print Usage, exit 0).
var ErrHelp = flag.ErrHelp

// Parse reads env and then args (flags win). A returned *errs.Error of kind
// Invalid is a usage error (exit 2).
func Parse(args []string, env map[string]string) (Config, error) {
	fs := flag.NewFlagSet("joblease-sidecar", flag.ContinueOnError)
	fs.SetOutput(discard{})
	str := map[string]*string{}
	for _, n := range []string{"job", "namespace", "owner", "host", "port", "port-file", "probe-host", "probe-port",
		"probe-port-file", "token-file", "on-loss", "on-final", "worker-pid-file", "worker-process-name",
		"api-token-file", "max-result-bytes", "claim-backoff-initial", "claim-backoff-max", "registration-wait", "log-level",
		"queue", "item", "lease-ttl"} {
		str[n] = fs.String(n, "", "")
	}
	itemCreate := fs.Bool("item-create", false, "")
	exitWhenEmpty := fs.Bool("exit-when-empty", false, "")
	rel := fs.Bool("release-on-term", false, "")
	norel := fs.Bool("no-release-on-term", false, "")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return Config{}, ErrHelp
		}
		return Config{}, errs.Invalid(err.Error())
	}
	if fs.NArg() > 0 {
		return Config{}, errs.Invalid(fmt.Sprintf("Got unexpected extra argument (%s)", fs.Arg(0)))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	flagv := func(n string) (string, bool) { return *str[n], set[n] }

	c := Config{LossExitCode: 8, Backoff: Backoff{0.2, 5.0, 2.0}}
	var err error
	name := env["JOBLEASE_JOB_NAME"]
	namespace := firstNonEmpty(env["JOBLEASE_JOB_NAMESPACE"], env["POD_NAMESPACE"], "default")
	c.Job = protocol.JobRef{Namespace: namespace, Name: name}
	job, jobSet := flagv("job")
	ns, nsSet := flagv("namespace")
	if (jobSet && job != "") || (nsSet && ns != "") {
		if ns == "" {
			ns = namespace
		}
		if job == "" {
			job = name
		}
		c.Job = protocol.ParseJobRef(job, ns)
	}
	queue := env["JOBLEASE_QUEUE"]
	if v, ok := flagv("queue"); ok && v != "" {
		queue = v
	}
	if queue != "" {
		qns := namespace
		if nsSet && ns != "" {
			qns = ns
		}
		q := protocol.ParseQueueRef(queue, qns)
		c.Queue = &q
	}
	c.Item = env["JOBLEASE_ITEM"]
	if v, ok := flagv("item"); ok {
		c.Item = v
	}
	if c.ItemCreate, err = parseBool(env["JOBLEASE_ITEM_CREATE"], "JOBLEASE_ITEM_CREATE"); err != nil {
		return c, err
	}
	if set["item-create"] {
		c.ItemCreate = *itemCreate
	}
	if c.ExitWhenEmpty, err = parseBool(env["JOBLEASE_EXIT_WHEN_EMPTY"], "JOBLEASE_EXIT_WHEN_EMPTY"); err != nil {
		return c, err
	}
	if set["exit-when-empty"] {
		c.ExitWhenEmpty = *exitWhenEmpty
	}
	c.Owner = firstNonEmpty(env["JOBLEASE_OWNER"], defaultOwner(env))
	if c.Etcd, err = etcdFromEnv(env); err != nil {
		return c, err
	}
	if tf := env["JOBLEASE_SIDECAR_API_TOKEN_FILE"]; tf != "" {
		if c.APIToken, err = ReadSecret(tf); err != nil {
			return c, err
		}
	}
	c.Host = getDefault(env, "JOBLEASE_SIDECAR_HOST", "127.0.0.1")
	if c.Port, err = envInt(env, "JOBLEASE_SIDECAR_PORT", DefaultPort); err != nil {
		return c, err
	}
	c.PortFile = env["JOBLEASE_SIDECAR_PORT_FILE"]
	c.ProbeHost = getDefault(env, "JOBLEASE_SIDECAR_PROBE_HOST", "0.0.0.0")
	probe := strings.TrimSpace(getDefault(env, "JOBLEASE_SIDECAR_PROBE_PORT", strconv.Itoa(DefaultProbePort)))
	switch strings.ToLower(probe) {
	case "", "off", "none", "-1":
		c.ProbePort = -1
	default:
		if c.ProbePort, err = envInt(map[string]string{"p": probe}, "p", DefaultProbePort); err != nil {
			return c, err
		}
	}
	c.ProbePortFile = env["JOBLEASE_SIDECAR_PROBE_PORT_FILE"]
	c.TokenFile = getDefault(env, "JOBLEASE_TOKEN_FILE", DefaultTokenFile)
	c.OnLoss = getDefault(env, "JOBLEASE_SIDECAR_ON_LOSS", "signal")
	c.OnFinal = getDefault(env, "JOBLEASE_SIDECAR_ON_FINAL", "serve")
	c.WorkerPidFile = env["JOBLEASE_WORKER_PID_FILE"]
	c.WorkerProcessName = env["JOBLEASE_WORKER_PROCESS_NAME"]
	if c.ReleaseOnTerm, err = parseBool(getDefault(env, "JOBLEASE_SIDECAR_RELEASE_ON_TERM", "true"),
		"JOBLEASE_SIDECAR_RELEASE_ON_TERM"); err != nil {
		return c, err
	}
	if c.MaxResultBytes, err = envInt(env, "JOBLEASE_SIDECAR_MAX_RESULT_BYTES", protocol.MaxResultBytes); err != nil {
		return c, err
	}
	if c.Backoff.Initial, err = envFloat(env, "JOBLEASE_SIDECAR_CLAIM_BACKOFF_INITIAL", 0.2); err != nil {
		return c, err
	}
	if c.Backoff.Maximum, err = envFloat(env, "JOBLEASE_SIDECAR_CLAIM_BACKOFF_MAX", 5.0); err != nil {
		return c, err
	}
	if c.RegistrationWait, err = envFloat(env, "JOBLEASE_SIDECAR_REGISTRATION_WAIT", 30.0); err != nil {
		return c, err
	}
	leaseTTL, err := envInt(env, "JOBLEASE_LEASE_TTL", 0)
	if err != nil {
		return c, err
	}
	c.LeaseTTL = int64(leaseTTL)
	if v, ok := flagv("lease-ttl"); ok {
		if c.LeaseTTL, err = strconv.ParseInt(v, 10, 64); err != nil {
			return c, errs.Invalid(fmt.Sprintf("Invalid value for '--lease-ttl': %s is not a valid integer.", errs.PyRepr(v)))
		}
	}
	c.LogLevel = strings.ToUpper(getDefault(env, "JOBLEASE_LOG_LEVEL", "INFO"))
	c.RateLimit, c.RateLimitProblem = rateLimit(env, "JOBLEASE_SIDECAR_RATE_LIMIT", DefaultRateLimit)
	c.CheckpointRate, c.CheckpointRateProblem = rateLimit(env, "JOBLEASE_SIDECAR_CHECKPOINT_RATE",
		DefaultCheckpointRate)

	// Flags over the environment.
	for n, dst := range map[string]*string{"owner": &c.Owner, "host": &c.Host, "port-file": &c.PortFile,
		"probe-host": &c.ProbeHost, "probe-port-file": &c.ProbePortFile, "token-file": &c.TokenFile,
		"on-loss": &c.OnLoss, "on-final": &c.OnFinal, "worker-pid-file": &c.WorkerPidFile,
		"worker-process-name": &c.WorkerProcessName} {
		if v, ok := flagv(n); ok {
			*dst = v
		}
	}
	for n, dst := range map[string]*int{"port": &c.Port, "max-result-bytes": &c.MaxResultBytes} {
		if v, ok := flagv(n); ok {
			if *dst, err = strconv.Atoi(v); err != nil {
				return c, errs.Invalid(fmt.Sprintf("Invalid value for '--%s': %s is not a valid integer.", n, errs.PyRepr(v)))
			}
		}
	}
	if v, ok := flagv("probe-port"); ok {
		p, err := strconv.Atoi(v)
		if err != nil {
			return c, errs.Invalid(fmt.Sprintf("Invalid value for '--probe-port': %s is not a valid integer.", errs.PyRepr(v)))
		}
		c.ProbePort = max(p, -1)
	}
	floats := map[string]*float64{"registration-wait": &c.RegistrationWait}
	var bi, bm float64
	if _, ok := flagv("claim-backoff-initial"); ok {
		floats["claim-backoff-initial"] = &bi
	}
	if _, ok := flagv("claim-backoff-max"); ok {
		floats["claim-backoff-max"] = &bm
	}
	for n, dst := range floats {
		if v, ok := flagv(n); ok {
			if *dst, err = strconv.ParseFloat(v, 64); err != nil {
				return c, errs.Invalid(fmt.Sprintf("Invalid value for '--%s': %s is not a valid float.", n, errs.PyRepr(v)))
			}
		}
	}
	if bi != 0 {
		c.Backoff.Initial = bi
	}
	if bm != 0 {
		c.Backoff.Maximum = bm
	}
	if set["release-on-term"] {
		c.ReleaseOnTerm = *rel
	}
	if set["no-release-on-term"] && *norel {
		c.ReleaseOnTerm = false
	}
	if v, ok := flagv("api-token-file"); ok {
		if c.APIToken, err = ReadSecret(v); err != nil {
			return c, err
		}
	}
	if v, ok := flagv("log-level"); ok && v != "" {
		c.LogLevel = strings.ToUpper(v)
	}
	if v, ok := flagv("on-loss"); ok && !oneOf(v, "signal", "exit", "none") {
		return c, errs.Invalid(fmt.Sprintf("Invalid value for '--on-loss': %s is not one of 'signal', 'exit', 'none'.", errs.PyRepr(v)))
	}
	if v, ok := flagv("on-final"); ok && !oneOf(v, "serve", "exit") {
		return c, errs.Invalid(fmt.Sprintf("Invalid value for '--on-final': %s is not one of 'serve', 'exit'.", errs.PyRepr(v)))
	}
	if c.Queue != nil {
		if c.Job.Name != "" {
			return c, errs.Invalid(fmt.Sprintf("both a job (%s) and a queue (%s): set JOBLEASE_JOB_NAME or JOBLEASE_QUEUE, "+
				"not both", c.Job.Name, c.Queue))
		}
		return c, c.validate()
	}
	for name, given := range map[string]bool{"JOBLEASE_ITEM (--item)": c.Item != "",
		"JOBLEASE_ITEM_CREATE (--item-create)": c.ItemCreate, "JOBLEASE_EXIT_WHEN_EMPTY (--exit-when-empty)": c.ExitWhenEmpty} {
		if given {
			return c, errs.Invalid(name + " is for queue mode: set JOBLEASE_QUEUE (or --queue) too")
		}
	}
	if c.Job.Name == "" {
		return c, errs.Invalid("no job name: set JOBLEASE_JOB_NAME (or --job), or JOBLEASE_QUEUE (or --queue)")
	}
	return c, c.validate()
}

// Name is what the sidecar works on, for logs: the job, or the queue (and item).
func (c Config) Name() string {
	switch {
	case c.Queue == nil:
		return c.Job.String()
	case c.Item != "":
		return protocol.ItemRef{Queue: *c.Queue, ID: c.Item}.String()
	}
	return c.Queue.String()
}

func (c Config) validate() error {
	if c.Queue != nil {
		if err := protocol.ValidateQueue(*c.Queue); err != nil {
			return err
		}
		if c.Item != "" {
			if err := protocol.ValidateItemID(c.Item); err != nil {
				return err
			}
			if c.ExitWhenEmpty {
				return errs.Invalid("JOBLEASE_EXIT_WHEN_EMPTY is for draining a queue; with JOBLEASE_ITEM the sidecar " +
					"claims that one item: unset one of them")
			}
		} else if c.ItemCreate {
			return errs.Invalid("JOBLEASE_ITEM_CREATE needs JOBLEASE_ITEM: the id of the item to create (a CronJob slot)")
		}
	} else if err := protocol.ValidateJob(c.Job); err != nil {
		return err
	}
	if err := protocol.ValidateOwner(c.Owner); err != nil {
		return err
	}
	if !oneOf(c.OnLoss, "signal", "exit", "none") {
		return errs.Invalid(fmt.Sprintf("invalid on-loss action %s: one of signal, exit, none", errs.PyRepr(c.OnLoss)))
	}
	if !oneOf(c.OnFinal, "serve", "exit") {
		return errs.Invalid(fmt.Sprintf("invalid on-final action %s: one of serve, exit", errs.PyRepr(c.OnFinal)))
	}
	if c.Port < 0 || c.Port >= 65536 {
		return errs.Invalid(fmt.Sprintf("invalid port %d", c.Port))
	}
	if c.ProbePort >= 65536 {
		return errs.Invalid(fmt.Sprintf("invalid probe port %d", c.ProbePort))
	}
	if c.MaxResultBytes <= 0 {
		return errs.Invalid("max result bytes must be positive")
	}
	if c.RegistrationWait < 0 {
		return errs.Invalid("registration wait must be >= 0")
	}
	if c.LeaseTTL < 0 {
		return errs.Invalid("JOBLEASE_LEASE_TTL must be a whole number of seconds > 0 (or unset)")
	}
	return nil
}

// Describe is a log-safe summary: no passwords, no bearer token.
func (c Config) Describe() map[string]any {
	var probe, token any
	if c.ProbePort >= 0 {
		probe = fmt.Sprintf("%s:%d", c.ProbeHost, c.ProbePort)
	}
	if c.TokenFile != "" {
		token = c.TokenFile
	}
	eps := make([]any, len(c.Etcd.Endpoints))
	for i, e := range c.Etcd.Endpoints {
		eps[i] = e
	}
	var queue, item any
	if c.Queue != nil {
		queue = c.Queue.String()
		if c.Item != "" {
			item = c.Item
		}
	}
	job := any(c.Job.String())
	if c.Queue != nil {
		job = nil
	}
	return map[string]any{"job": job, "queue": queue, "item": item, "itemCreate": c.ItemCreate,
		"exitWhenEmpty": c.ExitWhenEmpty, "owner": c.Owner, "etcdEndpoints": eps, "etcdTLS": c.Etcd.TLS(),
		"etcdAuth": c.Etcd.Username != "", "root": c.Etcd.Root, "listen": fmt.Sprintf("%s:%d", c.Host, c.Port),
		"probeListen": probe, "tokenFile": token, "onLoss": c.OnLoss, "onFinal": c.OnFinal,
		"releaseOnTerm": c.ReleaseOnTerm, "apiAuth": c.APIToken != "", "maxResultBytes": int64(c.MaxResultBytes),
		"registrationWait": c.RegistrationWait, "leaseTtlHint": c.LeaseTTL}
}

func oneOf(v string, options ...string) bool {
	for _, o := range options {
		if v == o {
			return true
		}
	}
	return false
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

func getDefault(env map[string]string, key, def string) string {
	if v, ok := env[key]; ok {
		return v
	}
	return def
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
