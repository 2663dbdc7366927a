package selection

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestCostVectors mirrors Dynamo's selector logit tests (docs/selection-api.md,
// "How a rank is chosen").
func TestCostVectors(t *testing.T) {
	// isl 64, bs 16, 96 cached tokens (6 device blocks), active prefill 16,
	// decode 2 active + 3 new, S = 2, C = 1.
	in := costInput{tiers: Tiers{Device: 6}, activePrefill: 16, hasLoad: true, potentialDec: 5, taintMult: 1}
	s := scoring{credit: 1, scale: 2, hostW: 0.75, diskW: 0.25, trackPrefill: true}
	if got := s.cost(&in, 64, 16, 0); got != 7.0 {
		t.Fatalf("tracked cost = %v, want 7.0", got)
	}
	s.trackPrefill = false
	if got := s.cost(&in, 64, 16, 0); got != 5.0 {
		t.Fatalf("untracked cost = %v, want 5.0", got)
	}
}

func TestCostCreditDecayAndTaints(t *testing.T) {
	s := scoring{credit: 1, scale: 1, decay: 1, trackPrefill: true}
	// Loaded rank: 32 tokens over the minimum = 2 blocks; request 4 blocks:
	// decay = 1/(1+1*2/4) = 2/3 of the 3-block device credit = 2.
	in := costInput{tiers: Tiers{Device: 3}, activePrefill: 32, hasLoad: true, taintMult: 1}
	raw := (32.0 + 64) / 16 // active + isl (cached 48 < isl 64)
	want := raw - 2
	if got := s.cost(&in, 64, 16, 0); math.Abs(got-want) > 1e-9 {
		t.Fatalf("decayed cost %v, want %v", got, want)
	}
	m := preferredTaintMultiplier([]string{"gpu=a100"}, map[string]float32{"gpu=a100": 100})
	if math.Abs(m-math.Exp(-1)) > 1e-6 {
		t.Fatalf("taint multiplier %v", m)
	}
	if preferredTaintMultiplier([]string{"x"}, map[string]float32{"y": 1}) != 1 {
		t.Fatal("absent taint must not bias")
	}
}

func TestPickZeroTemperatureRandomizesTies(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	costs := []float64{3, 1, 1, 2, 1}
	seen := map[int]int{}
	for range 3000 {
		seen[pick(costs, 0, rng.Float64)]++
	}
	if len(seen) != 3 || seen[0] != 0 || seen[3] != 0 {
		t.Fatalf("ties not limited to minima: %v", seen)
	}
	for _, i := range []int{1, 2, 4} {
		if seen[i] < 800 || seen[i] > 1200 {
			t.Fatalf("tie %d picked %d of 3000 times; want about 1000 (%v)", i, seen[i], seen)
		}
	}
}

func TestPickSoftmax(t *testing.T) {
	// Range-normalised costs 0, 0.5, 1 at T=1: weights 1, e^-0.5, e^-1.
	costs := []float64{10, 20, 30}
	w := []float64{1, math.Exp(-0.5), math.Exp(-1)}
	total := w[0] + w[1] + w[2]
	cases := []struct {
		u    float64
		want int
	}{{0, 0}, {w[0]/total - 1e-9, 0}, {w[0]/total + 1e-9, 1}, {(w[0]+w[1])/total + 1e-9, 2}, {0.999999, 2}}
	for i, c := range cases {
		if got := pick(costs, 1, func() float64 { return c.u }); got != c.want {
			t.Errorf("Test %d: u=%v picked %d, want %d", i, c.u, got, c.want)
		}
	}
	// All equal: uniform by index.
	if got := pick([]float64{5, 5, 5, 5}, 0.5, func() float64 { return 0.6 }); got != 2 {
		t.Fatalf("uniform pick %d", got)
	}
	// A higher temperature spreads picks more evenly than a low one.
	rng := rand.New(rand.NewPCG(3, 4))
	low, high := 0, 0
	for range 2000 {
		if pick(costs, 0.1, rng.Float64) != 0 {
			low++
		}
		if pick(costs, 10, rng.Float64) != 0 {
			high++
		}
	}
	if low >= high {
		t.Fatalf("non-best picks: T=0.1 %d, T=10 %d", low, high)
	}
}
