package config

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/joblease/joblease/sidecar-go/internal/errs"
)

// The settings table of docs/sidecar.md, read the way config.py and the
// click command read it. Nothing is faked: real environments, real flags,
// real secret files in a temporary directory.

func TestEnvironmentAndDefaults(t *testing.T) {
	c, err := Parse(nil, map[string]string{"JOBLEASE_JOB_NAME": "train", "POD_NAMESPACE": "team-a",
		"POD_NAME": "pod-1", "POD_UID": "abc", "JOBLEASE_SIDECAR_PROBE_PORT": "off",
		"JOBLEASE_ETCD_ENDPOINTS": "https://e1:2379, e2:2379,", "JOBLEASE_SIDECAR_RATE_LIMIT": "off"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Job.String() != "team-a/train" || c.Owner != "pod-1/abc" {
		t.Fatalf("job %s owner %s", c.Job, c.Owner)
	}
	if c.Port != DefaultPort || c.Host != "127.0.0.1" || c.ProbePort != -1 || c.TokenFile != DefaultTokenFile ||
		c.TokenJSONFile() != DefaultTokenFile+".json" || c.OnLoss != "signal" || c.OnFinal != "serve" ||
		!c.ReleaseOnTerm || c.MaxResultBytes != 65536 || c.RegistrationWait != 30 || c.RateLimit != 0 {
		t.Fatalf("defaults: %+v", c)
	}
	if strings.Join(c.Etcd.Endpoints, "|") != "https://e1:2379|e2:2379" || !c.Etcd.TLS() || c.Etcd.Root != "/joblease/v1" {
		t.Fatalf("etcd: %+v", c.Etcd)
	}
}

func TestFlagsOverrideTheEnvironment(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "bearer")
	if err := os.WriteFile(secret, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"JOBLEASE_JOB_NAME": "a", "JOBLEASE_SIDECAR_PORT": "1", "JOBLEASE_SIDECAR_ON_LOSS": "exit",
		"JOBLEASE_SIDECAR_RELEASE_ON_TERM": "true", "JOBLEASE_SIDECAR_CLAIM_BACKOFF_INITIAL": "0.05"}
	c, err := Parse([]string{"--job", "ns/b", "--port", "0", "--on-loss", "none", "--no-release-on-term",
		"--probe-port", "-1", "--claim-backoff-max", "0.2", "--api-token-file", secret, "--log-level", "debug"}, env)
	if err != nil {
		t.Fatal(err)
	}
	if c.Job.String() != "ns/b" || c.Port != 0 || c.OnLoss != "none" || c.ReleaseOnTerm || c.ProbePort != -1 ||
		c.Backoff.Initial != 0.05 || c.Backoff.Maximum != 0.2 || c.APIToken != "s3cret" || c.LogLevel != "DEBUG" {
		t.Fatalf("%+v", c)
	}
	for k, v := range c.Describe() {
		if s, ok := v.(string); ok && strings.Contains(s, "s3cret") {
			t.Fatalf("Describe leaks the bearer token in %s", k)
		}
	}
}

func TestBadSettingsAreRefusedAsUsageErrors(t *testing.T) {
	base := map[string]string{"JOBLEASE_JOB_NAME": "a"}
	cases := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, map[string]string{}, "no job name"},
		{[]string{"--on-loss", "bogus"}, base, "'bogus' is not one of"},
		{[]string{"--on-final", "later"}, base, "'later' is not one of"},
		{[]string{"--port", "x"}, base, "is not a valid integer"},
		{nil, map[string]string{"JOBLEASE_JOB_NAME": "a", "JOBLEASE_SIDECAR_PORT": "70000"}, "invalid port"},
		{nil, map[string]string{"JOBLEASE_JOB_NAME": "Bad_Name"}, "invalid job name"},
		{nil, map[string]string{"JOBLEASE_JOB_NAME": "a", "JOBLEASE_SIDECAR_RELEASE_ON_TERM": "maybe"}, "expected true/false"},
		{nil, map[string]string{"JOBLEASE_JOB_NAME": "a", "JOBLEASE_SIDECAR_API_TOKEN_FILE": "/nonexistent/x"}, "cannot read secret file"},
		{nil, map[string]string{"JOBLEASE_JOB_NAME": "a", "JOBLEASE_OWNER": "has space"}, "printable ASCII"},
		{[]string{"extra"}, base, "unexpected extra argument"},
	}
	for _, tc := range cases {
		_, err := Parse(tc.args, tc.env)
		e, ok := err.(*errs.Error)
		if !ok || e.Kind != errs.KindInvalid || !strings.Contains(e.Message, tc.want) {
			t.Errorf("%v %v: got %v, want an invalid-input error containing %q", tc.args, tc.env, err, tc.want)
		}
	}
}

func TestAnUnusableRateLimitKeepsTheDefault(t *testing.T) {
	c, err := Parse(nil, map[string]string{"JOBLEASE_JOB_NAME": "a", "JOBLEASE_SIDECAR_RATE_LIMIT": "-3"})
	if err != nil {
		t.Fatal(err)
	}
	if c.RateLimit != DefaultRateLimit || c.RateLimitProblem != "-3" {
		t.Fatalf("rate %v problem %q", c.RateLimit, c.RateLimitProblem)
	}
}

// Every default --help states ("[VARIABLE; default]") is the one Parse
// uses when neither the variable nor the flag is given; docs/sidecar.md's
// settings table is held to --help by tests/test_documented_defaults.py, so
// the table, --help and the code say the same.
func TestHelpStatesTheDefaultsParseUses(t *testing.T) {
	c, err := Parse(nil, map[string]string{"JOBLEASE_JOB_NAME": "j", "JOBLEASE_OWNER": "o"})
	if err != nil {
		t.Fatal(err)
	}
	actual := map[string]string{
		"JOBLEASE_SIDECAR_HOST":                  c.Host,
		"JOBLEASE_SIDECAR_PORT":                  strconv.Itoa(c.Port),
		"JOBLEASE_SIDECAR_PROBE_HOST":            c.ProbeHost,
		"JOBLEASE_SIDECAR_PROBE_PORT":            strconv.Itoa(c.ProbePort),
		"JOBLEASE_TOKEN_FILE":                    c.TokenFile,
		"JOBLEASE_SIDECAR_ON_LOSS":               c.OnLoss,
		"JOBLEASE_SIDECAR_ON_FINAL":              c.OnFinal,
		"JOBLEASE_SIDECAR_RELEASE_ON_TERM":       strconv.FormatBool(c.ReleaseOnTerm),
		"JOBLEASE_SIDECAR_MAX_RESULT_BYTES":      strconv.Itoa(c.MaxResultBytes),
		"JOBLEASE_SIDECAR_CLAIM_BACKOFF_INITIAL": strconv.FormatFloat(c.Backoff.Initial, 'g', -1, 64),
		"JOBLEASE_SIDECAR_CLAIM_BACKOFF_MAX":     strconv.FormatFloat(c.Backoff.Maximum, 'g', -1, 64),
		"JOBLEASE_SIDECAR_REGISTRATION_WAIT":     strconv.FormatFloat(c.RegistrationWait, 'g', -1, 64),
		"JOBLEASE_LOG_LEVEL":                     c.LogLevel,
		"JOBLEASE_ITEM_CREATE":                   strconv.FormatBool(c.ItemCreate),
		"JOBLEASE_EXIT_WHEN_EMPTY":               strconv.FormatBool(c.ExitWhenEmpty),
	}
	stated := map[string]string{}
	for _, m := range regexp.MustCompile(`\[(JOBLEASE_[A-Z_]+); ([^\]]+)\]`).FindAllStringSubmatch(Usage, -1) {
		if !strings.HasPrefix(m[2], "default ") { // "default POD_NAME/POD_UID": not a constant
			stated[m[1]] = m[2]
		}
	}
	for name, value := range actual {
		if stated[name] != value {
			t.Errorf("%s: --help says %q, Parse uses %q", name, stated[name], value)
		}
	}
	for name := range stated {
		if _, ok := actual[name]; !ok {
			t.Errorf("--help states a default for %s that this test does not check", name)
		}
	}
}

func TestQueueModeIsReadFromTheEnvironmentAndFlags(t *testing.T) {
	base := map[string]string{"JOBLEASE_OWNER": "o", "POD_NAMESPACE": "team-a"}
	with := func(extra map[string]string) map[string]string {
		env := map[string]string{}
		for k, v := range base {
			env[k] = v
		}
		for k, v := range extra {
			env[k] = v
		}
		return env
	}
	c, err := Parse(nil, with(map[string]string{"JOBLEASE_QUEUE": "files"}))
	if err != nil || c.Queue == nil || c.Queue.String() != "team-a/files" || c.Item != "" || c.Name() != "team-a/files" {
		t.Fatalf("drain mode: %+v %v", c, err)
	}
	c, err = Parse(nil, with(map[string]string{"JOBLEASE_QUEUE": "ns/nightly", "JOBLEASE_ITEM": "2026-12-01T23:00:00Z",
		"JOBLEASE_ITEM_CREATE": "true"}))
	if err != nil || c.Queue.String() != "ns/nightly" || c.Item != "2026-12-01T23:00:00Z" || !c.ItemCreate {
		t.Fatalf("slot mode: %+v %v", c, err)
	}
	c, err = Parse([]string{"--queue", "shards", "--item", "7", "--namespace", "b"}, base)
	if err != nil || c.Queue.String() != "b/shards" || c.Item != "7" || c.Name() != "b/shards/7" {
		t.Fatalf("flags: %+v %v", c, err)
	}
	c, err = Parse([]string{"--exit-when-empty"}, with(map[string]string{"JOBLEASE_QUEUE": "q"}))
	if err != nil || !c.ExitWhenEmpty {
		t.Fatalf("--exit-when-empty: %+v %v", c, err)
	}
	for name, env := range map[string]map[string]string{
		"job and queue":            {"JOBLEASE_QUEUE": "q", "JOBLEASE_JOB_NAME": "j"},
		"item without queue":       {"JOBLEASE_JOB_NAME": "j", "JOBLEASE_ITEM": "1"},
		"create without item":      {"JOBLEASE_QUEUE": "q", "JOBLEASE_ITEM_CREATE": "true"},
		"exit-when-empty and item": {"JOBLEASE_QUEUE": "q", "JOBLEASE_ITEM": "1", "JOBLEASE_EXIT_WHEN_EMPTY": "1"},
		"bad item id":              {"JOBLEASE_QUEUE": "q", "JOBLEASE_ITEM": "a/b"},
		"bad queue name":           {"JOBLEASE_QUEUE": "_queues"},
		"bad bool":                 {"JOBLEASE_QUEUE": "q", "JOBLEASE_EXIT_WHEN_EMPTY": "maybe"},
	} {
		if _, err := Parse(nil, with(env)); err == nil {
			t.Errorf("%s: accepted", name)
		} else if e, ok := err.(*errs.Error); !ok || e.Kind != errs.KindInvalid {
			t.Errorf("%s: %v is not a usage error", name, err)
		}
	}
}

func TestTheCheckpointRateDefaultsOffAndKeepsTheDefaultWhenUnusable(t *testing.T) {
	for env, want := range map[string]struct {
		rate    float64
		problem string
	}{"": {DefaultCheckpointRate, ""}, "off": {0, ""}, "0": {0, ""}, "4096": {4096, ""},
		"-1": {DefaultCheckpointRate, "-1"}, "lots": {DefaultCheckpointRate, "lots"}} {
		vars := map[string]string{"JOBLEASE_JOB_NAME": "a"}
		if env != "" {
			vars["JOBLEASE_SIDECAR_CHECKPOINT_RATE"] = env
		}
		c, err := Parse(nil, vars)
		if err != nil {
			t.Fatal(err)
		}
		if c.CheckpointRate != want.rate || c.CheckpointRateProblem != want.problem {
			t.Errorf("%q: rate %v problem %q, want %v %q", env, c.CheckpointRate, c.CheckpointRateProblem, want.rate, want.problem)
		}
	}
}

func TestLeaseTTLHint(t *testing.T) {
	base := map[string]string{"JOBLEASE_JOB_NAME": "train", "POD_NAME": "pod-1", "POD_UID": "abc"}
	with := func(v string) map[string]string {
		env := map[string]string{"JOBLEASE_LEASE_TTL": v}
		for k, x := range base {
			env[k] = x
		}
		return env
	}
	if c, err := Parse(nil, base); err != nil || c.LeaseTTL != 0 {
		t.Fatalf("unset: %d, %v (want 0: no hint)", c.LeaseTTL, err)
	}
	if c, err := Parse(nil, with("30")); err != nil || c.LeaseTTL != 30 {
		t.Fatalf("30: %d, %v", c.LeaseTTL, err)
	}
	if c, err := Parse([]string{"--lease-ttl", "12"}, with("30")); err != nil || c.LeaseTTL != 12 {
		t.Fatalf("--lease-ttl 12 over 30: %d, %v", c.LeaseTTL, err)
	}
	if _, err := Parse([]string{"--lease-ttl", "x"}, base); !errs.Is(err, errs.KindInvalid) {
		t.Fatalf("--lease-ttl x: %v, want a usage error", err)
	}
	for _, bad := range []string{"-1", "thirty", "1.5"} {
		if _, err := Parse(nil, with(bad)); !errs.Is(err, errs.KindInvalid) {
			t.Fatalf("JOBLEASE_LEASE_TTL=%s: %v, want a usage error", bad, err)
		}
	}
}
