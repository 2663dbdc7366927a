package zmqframes

import (
	"os"
	"testing"
)

// libzmq's getpid is this process's id, and a child forked without exec
// gets its own, not the one the parent kept.
func TestGetpidKeptAndForgottenOnFork(t *testing.T) {
	for range 2 { // the second answer is the kept one
		if got, want := processID(), os.Getpid(); got != want {
			t.Fatalf("getpid %d, want %d", got, want)
		}
	}
	ok, err := forkedChildSeesItsOwnID()
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatal("a forked child's getpid answered its parent's id")
	}
}
