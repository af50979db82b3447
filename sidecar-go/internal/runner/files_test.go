package runner

import (
	"fmt"
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

// A reader of the token file while it is rewritten (item after item of a
// draining sidecar) sees one whole version or the other, never a torn or
// empty file; a write publishIf refuses publishes nothing and leaves no
// temporary behind.
func TestWriteAtomicIsNeverSeenTornAndPublishesOnlyIfAllowed(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token.json")
	versions := [][]byte{[]byte(`{"token": 7}` + "\n"), []byte(`{"token": 123456789, "item": "a-longer-one"}` + "\n")}
	if ok, err := WriteAtomic(path, versions[0], nil); !ok || err != nil {
		t.Fatalf("first write: %v %v", ok, err)
	}
	stop := make(chan struct{})
	bad := make(chan string, 1)
	go func() {
		for {
			select {
			case <-stop:
				close(bad)
				return
			default:
			}
			got, err := os.ReadFile(path)
			if err != nil || (string(got) != string(versions[0]) && string(got) != string(versions[1])) {
				bad <- fmt.Sprintf("read %q (%v)", got, err)
				return
			}
		}
	}()
	for i := range 2000 {
		if _, err := WriteAtomic(path, versions[i%2], nil); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	if why, ok := <-bad; ok {
		t.Fatalf("a reader saw neither version: %s", why)
	}
	if ok, err := WriteAtomic(path, []byte("99\n"), func() bool { return false }); ok || err != nil {
		t.Fatalf("a refused write: published %v, %v", ok, err)
	}
	entries, _ := os.ReadDir(dir)
	if got, _ := os.ReadFile(path); len(entries) != 1 || string(got) != string(versions[1]) {
		t.Fatalf("after a refused write: %d entries, %q", len(entries), got)
	}
}
