// Package etcdtest runs a real etcd for the Go tests: the pinned build that
// hack/build-test-binaries caches (${JOBLEASE_CACHE}/bin/etcd-<ETCD_VERSION>/etcd,
// or JOBLEASE_ETCD_BIN), on free loopback ports. Nothing is mocked. Only
// tests import it.
package etcdtest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/joblease/joblease/sidecar-go/internal/etcd"
)

// repoFile finds rel in the repository, walking up from the working directory (go
// test runs each package's tests in its own directory). Not from runtime.Caller:
// under -trimpath that names the module path, not a file on disk.
func repoFile(t testing.TB, rel string) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		p := filepath.Join(dir, rel)
		if _, err := os.Stat(p); err == nil {
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no %s in any directory above the working directory", rel)
		}
		dir = parent
	}
}

// Binary is the etcd to run.
func Binary(t testing.TB) string {
	if b := os.Getenv("JOBLEASE_ETCD_BIN"); b != "" {
		return b
	}
	f, err := os.Open(repoFile(t, filepath.Join("hack", "versions.env")))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	version := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "ETCD_VERSION="); ok {
			version = v
		}
	}
	cache := os.Getenv("JOBLEASE_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "joblease")
	}
	bin := filepath.Join(cache, "bin", "etcd-"+version, "etcd")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no etcd binary at %s (run hack/build-test-binaries etcd, or set JOBLEASE_ETCD_BIN)", bin)
	}
	return bin
}

// FreePort is a loopback port free right now.
func FreePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start runs one etcd member until the test ends; returns its endpoint and
// process (ready: a read has succeeded). The ports are free when picked, but
// another process (go test runs packages side by side, each with its own
// etcds) can bind one before etcd does; etcd then exits at once, and Start
// tries again on other ports, up to three times, saying why each start failed.
func Start(t testing.TB) (string, *os.Process) {
	var failures []string
	for attempt := 1; attempt <= 3; attempt++ {
		ep, proc, err := startOnce(t)
		if err == nil {
			return ep, proc
		}
		failures = append(failures, err.Error())
	}
	t.Fatalf("etcd did not come up in three starts: %s", strings.Join(failures, "; "))
	return "", nil
}

// startOnce starts one etcd on two fresh free ports and waits until it answers
// (up to 30 s), or returns why it did not (exited, with its log's tail).
func startOnce(t testing.TB) (string, *os.Process, error) {
	dir := t.TempDir()
	client := FreePort(t)
	peer := FreePort(t)
	for peer == client {
		peer = FreePort(t)
	}
	cu, pu := fmt.Sprintf("http://127.0.0.1:%d", client), fmt.Sprintf("http://127.0.0.1:%d", peer)
	logPath := filepath.Join(dir, "etcd.log")
	log, _ := os.Create(logPath)
	cmd := exec.Command(Binary(t), "--data-dir", filepath.Join(dir, "data"), "--listen-client-urls", cu,
		"--advertise-client-urls", cu, "--listen-peer-urls", pu, "--initial-advertise-peer-urls", pu,
		"--initial-cluster", "default="+pu)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-exited
		log.Close()
	})
	ep := fmt.Sprintf("127.0.0.1:%d", client)
	store := NewStore(t, ep)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, _, err := store.Get(ctx, "/probe")
		cancel()
		if err == nil {
			return ep, cmd.Process, nil
		}
		select {
		case <-exited:
			return "", nil, fmt.Errorf("etcd on ports %d/%d exited before it answered: %s", client, peer, logTail(logPath))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd did not come up within 30 s: %v (log: %s)", err, logTail(logPath))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// logTail is the last few hundred bytes of an etcd log, for a failure message.
func logTail(path string) string {
	data, _ := os.ReadFile(path)
	if len(data) > 600 {
		data = data[len(data)-600:]
	}
	return strings.TrimSpace(string(data))
}

// NewStore is a client of ep, closed when the test ends.
func NewStore(t testing.TB, ep string) *etcd.Store {
	s, err := etcd.New(etcd.Config{Endpoints: []string{ep}, RequestTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}
