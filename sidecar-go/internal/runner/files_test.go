package runner

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A pid file is trusted only to name one process: 0 would signal the
// sidecar's whole process group, -1 every process it may signal, a negative
// number a group, and a number past 32 bits wraps to one of those in the
// kernel's pid_t. Each is refused (logged), and nothing is signalled.
func TestAPidFileThatNamesNoSingleProcessIsRefused(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		text string
		want []int
	}{
		{"1234\n", []int{1234}},
		{"0\n", nil},
		{"-1\n", nil},
		{"-4321", nil},
		{"4294967295", nil}, // -1 as pid_t
		{"4294967296", nil}, // 0 as pid_t
		{"99999999999999999999", nil},
		{"12abc", nil},
		{"", nil},
	} {
		path := filepath.Join(dir, "worker.pid")
		if err := os.WriteFile(path, []byte(tc.text), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := findWorkerPids(path, ""); !slices.Equal(got, tc.want) {
			t.Errorf("pid file %q: pids %v, want %v", tc.text, got, tc.want)
		}
	}
}

// What a dead incarnation left on the token volume (the token file, its
// .json, a temporary from a write cut short) is removed; other files stay.
func TestRemoveStaleTakesTheTokenFilesAndTheirTemporaries(t *testing.T) {
	dir := t.TempDir()
	token, info := filepath.Join(dir, "token"), filepath.Join(dir, "token.json")
	keep := filepath.Join(dir, "port")
	for _, p := range []string{token, info, keep, filepath.Join(dir, ".token.41.tmp"), filepath.Join(dir, ".token.json.41.tmp")} {
		if err := os.WriteFile(p, []byte("7\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := removeStale(token, info, ""); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != "port" {
		t.Fatalf("left %v", entries)
	}
	if err := removeStale(token, info); err != nil {
		t.Fatalf("files already gone: %v", err)
	}
}
