package selection

import (
	"math"
)

// The cost function and picker, Dynamo's (docs/selection-api.md, "How a
// rank is chosen"). Lower cost is better.

// costInput is everything the cost of one rank depends on.
type costInput struct {
	tiers          Tiers
	sharedBeyond   float64
	activePrefill  uint64
	hasLoad        bool // the rank has a load entry (always true for catalog ranks)
	potentialDec   uint64
	activeRequests uint64
	taintMult      float64 // 1 when there are no preferred taints
}

// withInFlight returns t with its device prefix raised to inflight blocks
// (booked in flight on the rank, so cached there by the time the engine
// admits this prompt); the host and disk tiers continue after the device
// prefix, so they shrink by what the device prefix gained.
func withInFlight(t Tiers, inflight uint32) Tiers {
	if inflight <= t.Device {
		return t
	}
	gain := inflight - t.Device
	t.Device = inflight
	h := min(gain, t.Host)
	t.Host -= h
	t.Disk -= min(gain-h, t.Disk)
	return t
}

// costInputOf is what the cost of a rank reads, from its view of the load,
// the tiers the index matched on it and the hits leading blocks of this
// prompt (of nTrack) its bookings in flight cover. The scoring loop and
// the re-check of a pick whose load moved (stillCheapest) both build it
// here, so the re-check prices the rank as the loop did.
func (s *scoring) costInputOf(v *rankView, tiers Tiers, hits uint32, nTrack uint64, trackActive bool, taintMult float64) costInput {
	if s.inFlight && !v.loadOnly {
		tiers = withInFlight(tiers, hits)
	}
	in := costInput{tiers: tiers, activePrefill: v.prefillTokens, hasLoad: true,
		activeRequests: v.requests, taintMult: taintMult}
	if trackActive {
		in.potentialDec = v.decodeBlocks() + nTrack - uint64(hits)
	}
	return in
}

// overlapCredit is the credit, in blocks, a rank earns for what it holds.
func (s *scoring) overlapCredit(in *costInput, decay float64) float64 {
	return s.credit*decay*float64(in.tiers.Device) +
		s.hostW*float64(in.tiers.Host) +
		s.diskW*float64(in.tiers.Disk) +
		s.shared*in.sharedBeyond
}

// cachedTokens is round(effective overlap blocks × block size).
func (s *scoring) cachedTokens(t Tiers, bs uint32) uint64 {
	eff := float64(t.Device) + s.hostW*float64(t.Host) + s.diskW*float64(t.Disk)
	return uint64(math.Round(eff * float64(bs)))
}

func effectivePrefill(isl, cached uint64) uint64 { return isl - min(cached, isl) }

// rawPrefillTokens follows Dynamo's operation order: with tracking and a
// load entry it is active + effective + cached, i.e. active + max(isl, cached).
func (s *scoring) rawPrefillTokens(in *costInput, isl, cached uint64) uint64 {
	if !s.trackPrefill {
		return 0
	}
	if !in.hasLoad {
		return isl
	}
	return in.activePrefill + effectivePrefill(isl, cached) + cached
}

// cost computes one rank's logit times its taint multiplier. With
// unclipped credit the logit can be negative; the picker only compares.
func (s *scoring) cost(in *costInput, isl uint64, bs uint32, minActivePrefill uint64) float64 {
	cached := s.cachedTokens(in.tiers, bs)
	rawBlocks := float64(s.rawPrefillTokens(in, isl, cached)) / float64(bs)
	decay := 1.0
	if s.trackPrefill && s.decay > 0 {
		reqBlocks := math.Ceil(float64(isl) / float64(bs))
		if reqBlocks < 1 {
			reqBlocks = 1
		}
		excess := math.Max(0, float64(in.activePrefill)-float64(minActivePrefill)) / float64(bs)
		decay = 1 / (1 + s.decay*excess/reqBlocks)
	}
	credit := s.overlapCredit(in, decay)
	prefill := rawBlocks - credit
	if !s.unclipped {
		prefill = math.Max(0, prefill) // Dynamo's: a credit never goes below free
	}
	logit := s.scale*prefill + float64(in.potentialDec) + s.reqWeight*float64(in.activeRequests)
	return logit * in.taintMult
}

// preferredTaintMultiplier is exp(-tanh(Σ weights of preferred taints the
// worker has)), in [1/e, e].
func preferredTaintMultiplier(workerTaints []string, preferred map[string]float32) float64 {
	if len(preferred) == 0 {
		return 1
	}
	var sum float64
	for _, t := range workerTaints {
		if w, ok := preferred[t]; ok {
			sum += float64(w)
		}
	}
	return math.Exp(-math.Tanh(sum))
}

// pick chooses an index from costs: the minimum with random tie-break at
// temperature 0, else a softmax over range-normalised costs. rnd draws in [0,1).
func pick(costs []float64, temperature float64, rnd func() float64) int {
	if len(costs) == 0 {
		return -1
	}
	if temperature <= 0 {
		best, ties := 0, 1
		for i := 1; i < len(costs); i++ {
			switch {
			case costs[i] < costs[best]:
				best, ties = i, 1
			case costs[i] == costs[best]:
				// Reservoir sampling: the k-th tie replaces the pick with
				// probability 1/k, so every tie is equally likely.
				ties++
				if rnd()*float64(ties) < 1 {
					best = i
				}
			}
		}
		return best
	}
	lo, hi := costs[0], costs[0]
	for _, c := range costs {
		lo, hi = math.Min(lo, c), math.Max(hi, c)
	}
	if lo == hi {
		return min(int(rnd()*float64(len(costs))), len(costs)-1)
	}
	rng := hi - lo
	scale := 1.0
	if math.IsInf(rng, 0) {
		// Costs so far apart that their range overflows: divide by the
		// largest magnitude first.
		scale = math.Max(math.Abs(lo), math.Abs(hi))
		lo = lo / scale
		rng = hi/scale - lo
	}
	weights := make([]float64, len(costs))
	var total float64
	for i, c := range costs {
		w := math.Exp(-(c/scale - lo) / (rng * temperature))
		weights[i] = w
		total += w
	}
	u := rnd()
	var cum float64
	for i, w := range weights {
		cum += w / total
		if cum >= u {
			return i
		}
	}
	return len(costs) - 1
}
