package runner

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// WriteAtomic makes readers see the old file or the new one, never a torn
// write: a temporary file in the same directory, renamed over the path (a
// rename replaces a name atomically for every reader). publishIf is asked
// right before the rename; if it says no, nothing is published. Returns
// whether the file was published.
//
// Nothing is fsynced: durability would buy nothing and cost milliseconds per
// item of a draining sidecar (two files per claim, four fsyncs; 4 ms at the
// median and tens at the tail on a busy disk, the largest cost inside the
// sidecar per item). The files only mean something to the running kernel's
// readers: after a crash the token is a dead incarnation's, and the sidecar
// removes these files (RemoveStaleFiles) before it serves or claims anything,
// as it removes them unsynced when a lease ends.
func WriteAtomic(path string, data []byte, publishIf func() bool) (bool, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	tmp := filepath.Join(dir, fmt.Sprintf(".%s.%d.tmp", filepath.Base(path), os.Getpid()))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return false, err
	}
	_, werr := f.Write(data)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(tmp)
		return false, err
	}
	if publishIf != nil && !publishIf() {
		_ = os.Remove(tmp)
		return false, nil
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return false, err
	}
	return true, nil
}

// removeStale removes each path and any temporary WriteAtomic left for it
// (".<name>.<pid>.tmp", from a process killed between write and rename).
// Files already gone are fine; one that cannot be removed is an error.
func removeStale(paths ...string) error {
	var failed []error
	for _, path := range paths {
		if path == "" {
			continue
		}
		tmps, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "."+globQuote(filepath.Base(path))+".*.tmp"))
		for _, p := range append([]string{path}, tmps...) {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				failed = append(failed, err)
			}
		}
	}
	return errors.Join(failed...)
}

func globQuote(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

func removeQuietly(path string) {
	if path != "" {
		_ = os.Remove(path)
	}
}

// findWorkerPids: from the pid file, else by name in the (shared) process
// namespace, matching comm or the basename of argv[0]/argv[1].
func findWorkerPids(pidFile, processName string) []int {
	if pidFile != "" {
		data, err := os.ReadFile(pidFile)
		if err == nil {
			text := strings.TrimSpace(string(data))
			if text == "" {
				return nil
			}
			// 32 bits: the kernel reads pid_t, so 4294967295 would arrive as -1.
			if pid, err := strconv.ParseInt(text, 10, 32); err != nil && !errors.Is(err, strconv.ErrRange) {
				slog.Warn("cannot read worker pid file", "path", pidFile, "reason", err.Error())
			} else if err != nil || pid <= 0 {
				// kill(0) signals our whole process group, kill(-1) every
				// process we may signal, kill(-n) group n: never one worker.
				slog.Error("refusing a worker pid file that names no single process", "path", pidFile, "pid", text)
			} else {
				return []int{int(pid)}
			}
		} else {
			slog.Warn("cannot read worker pid file", "path", pidFile, "reason", err.Error())
		}
	}
	if processName == "" {
		return nil
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	me := os.Getpid()
	var found []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == me || pid == 1 {
			continue
		}
		comm, err1 := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		cmdline, err2 := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err1 != nil || err2 != nil {
			continue
		}
		names := map[string]bool{strings.TrimSpace(string(comm)): true}
		for i, a := range strings.Split(string(cmdline), "\x00") {
			if i >= 2 {
				break
			}
			if a != "" {
				names[filepath.Base(a)] = true
			}
		}
		if names[processName] {
			found = append(found, pid)
		}
	}
	return found
}

// signalWorker sends SIGTERM to the configured worker; returns the pids signalled.
func signalWorker(pidFile, processName string) []int {
	var signalled []int
	for _, pid := range findWorkerPids(pidFile, processName) {
		err := syscall.Kill(pid, syscall.SIGTERM)
		switch {
		case err == nil:
			signalled = append(signalled, pid)
		case errors.Is(err, syscall.ESRCH):
			slog.Info("worker already gone", "pid", pid)
		case errors.Is(err, syscall.EPERM):
			slog.Error("not permitted to signal the worker", "pid", pid)
		}
	}
	return signalled
}
