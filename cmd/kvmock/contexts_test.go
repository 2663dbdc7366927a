package main

import "testing"

// TestContextsFlag: --max-model-len-of gives the named workers their own
// context and leaves the others at --max-model-len; a malformed pair or a
// worker the fleet does not have is refused.
func TestContextsFlag(t *testing.T) {
	cfg, err := parseFlags([]string{"--workers", "3", "--max-model-len", "8192", "--max-model-len-of", "1=4096, 3=65536"})
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[int]int{1: 4096, 2: 8192, 3: 65536} {
		if got := cfg.contextOf(id); got != want {
			t.Errorf("worker %d: context %d, want %d", id, got, want)
		}
	}
	for _, bad := range []string{"1:4096", "x=1", "4=4096", "1=1"} {
		cfg, err := parseFlags([]string{"--workers", "3", "--max-model-len-of", bad})
		if err == nil {
			err = cfg.Validate()
		}
		if err == nil {
			t.Errorf("--max-model-len-of %s was taken", bad)
		}
	}
}
