package selection

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// A reload's new settings apply to the running router at once, with its
// workers and bookings kept: here a client bound lowered below what a
// client already holds, then raised again.
func TestReconfigureAppliesLive(t *testing.T) {
	r := newTestRouter(t, func(c *Config) { c.MaxReservationsPerClient = 10 })
	addWorker(t, r, 1, nil)
	book := func() error {
		_, err := r.SelectAndReserve(&SelectRequest{Prompt: Prompt{TokenIDs: make([]uint32, 32)}, Client: "c"})
		return err
	}
	for range 3 {
		if err := book(); err != nil {
			t.Fatal(err)
		}
	}
	cfg := r.Config()
	cfg.MaxReservationsPerClient = 3
	cfg.PrefillLoadScale = 4
	if fixed, err := r.Reconfigure(cfg); err != nil || len(fixed) != 0 {
		t.Fatalf("Reconfigure: fixed %v, err %v", fixed, err)
	}
	mustStatus(t, book(), 429, "max_reservations_per_client")
	if got := r.Config(); got.PrefillLoadScale != 4 || r.ActiveReservations() != 3 || len(r.Catalog().ListWorkers("", "")) != 1 {
		t.Fatalf("after Reconfigure: scale %v, %d reservations, workers %v", got.PrefillLoadScale, r.ActiveReservations(), r.Catalog().ListWorkers("", ""))
	}
	cfg.MaxReservationsPerClient = 5
	if _, err := r.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	if err := book(); err != nil {
		t.Fatalf("raised bound: %v", err)
	}
}

// Settings that shape what the router built at start keep their running
// values, and Reconfigure names them; an invalid config changes nothing.
func TestReconfigureKeepsFixedSettings(t *testing.T) {
	r := newTestRouter(t, nil)
	before := r.Config()
	cfg := before
	cfg.UseKVEvents = true
	cfg.PendingTTL = time.Hour
	cfg.TrackActiveBlocks = !cfg.TrackActiveBlocks
	cfg.RouterTemperature = 0.5
	fixed, err := r.Reconfigure(cfg)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(fixed)
	if want := []string{"PendingTTL", "TrackActiveBlocks", "UseKVEvents"}; !slices.Equal(fixed, want) {
		t.Fatalf("fixed %v, want %v", fixed, want)
	}
	got := r.Config()
	if got.UseKVEvents || got.PendingTTL != before.PendingTTL || got.TrackActiveBlocks != before.TrackActiveBlocks || got.RouterTemperature != 0.5 {
		t.Fatalf("after Reconfigure: %+v", got)
	}
	bad := got
	bad.PrefillLoadScale = -1
	if _, err := r.Reconfigure(bad); err == nil || r.Config().PrefillLoadScale != got.PrefillLoadScale {
		t.Fatalf("an invalid config was applied: %v", err)
	}
}

// Dead-worker detection turned on by a reload takes effect on the
// running router: a worker failing for longer than the new grace is
// taken out at the next sweep.
func TestReconfigureTurnsHealthOn(t *testing.T) {
	now := time.Unix(0, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	cfg := DefaultConfig()
	cfg.UseKVEvents = false
	cfg.WorkerDownAfter = 0
	r, err := NewRouter(cfg, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	addWorker(t, r, 1, nil)
	r.Health().ReportFailure(1)
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	r.Sweep()
	if r.Health().WorkerDown(1) {
		t.Fatal("taken out with dead-worker detection off")
	}
	cfg.WorkerDownAfter = 30 * time.Second
	if _, err := r.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	r.Sweep()
	if !r.Health().WorkerDown(1) {
		t.Fatal("not taken out once worker_down_after was set")
	}
}
