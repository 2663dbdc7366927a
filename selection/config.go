package selection

import (
	"errors"
	"math"
	"math/rand/v2"
	"time"
)

// Config holds Dynamo's scheduler knobs and service limits, and our bounds
// (docs/selection-api.md, "How a rank is chosen" and "Bounds"). Start from
// DefaultConfig: its zero value is not Dynamo's defaults.
type Config struct {
	// OverlapScoreCredit is the credit per device-cached block (≥ 0).
	OverlapScoreCredit float64
	// OverlapScoreCreditDecay decays the device credit of loaded ranks (≥ 0).
	OverlapScoreCreditDecay float64
	// PrefillLoadScale multiplies the uncached prefill blocks (≥ 0).
	PrefillLoadScale float64
	// DecodeActiveRequestWeight is the cost per active request.
	DecodeActiveRequestWeight float64
	// HostCacheHitWeight is the credit per host-tier continuation block.
	HostCacheHitWeight float64
	// DiskCacheHitWeight is the credit per disk or external continuation block.
	DiskCacheHitWeight float64
	// SharedCacheMultiplier is the credit per shared-cache block beyond the
	// device prefix.
	SharedCacheMultiplier float64
	// RouterTemperature is the softmax temperature; 0 picks the minimum cost.
	RouterTemperature float64
	// UseKVEvents selects the event-fed index; false uses the approximate
	// index fed by bookings, and workers then need no kv_events endpoint.
	UseKVEvents bool
	// KVEventsBound means workers publish to one bound endpoint (bind
	// mode), so a worker needs no kv_events endpoint of its own.
	KVEventsBound bool
	// TrackActiveBlocks counts decode blocks in the cost.
	TrackActiveBlocks bool
	// TrackOutputBlocks counts output blocks reported through output_block.
	TrackOutputBlocks bool
	// TrackPrefillTokens counts prefill tokens in the cost.
	TrackPrefillTokens bool
	// AssumeKVReuse dedups shared prefixes in the decode-block count.
	AssumeKVReuse bool
	// InFlightOverlap credits a rank, in the cost, with the leading blocks
	// of the prompt that bookings in flight there already cover, as if
	// they were cached: the engine computes those prompts first (it admits
	// in order) and finds them cached when it reaches this one. Without it,
	// a prompt that arrives while its prefix is still queued on a worker
	// sees no overlap anywhere and goes wherever the load is lightest.
	// Not Dynamo's (which credits only what the index holds); off in
	// DefaultConfig, on in GatewayConfig.
	InFlightOverlap bool
	// UnclippedOverlapCredit lets a rank's overlap credit exceed its
	// prefill cost, so that of two ranks the one holding more of the
	// prompt costs less however large OverlapScoreCredit is. Dynamo stops
	// the prefill term at zero: with a credit above 1, every rank holding a
	// shared system prompt can reach zero and the choice between them
	// falls to the decode load alone. Off in DefaultConfig, on in
	// GatewayConfig.
	UnclippedOverlapCredit bool
	// ApproxTTL is how long a booked prefix counts as cached in the
	// approximate index.
	ApproxTTL time.Duration
	// DecodeBusyThreshold, when set, reports decode_busy as
	// potential_decode_blocks > threshold × total_kv_blocks.
	DecodeBusyThreshold *float64
	// PrefillBusyThreshold, when set, reports prefill_busy on advisory
	// selects as active_prefill_tokens > threshold × max_num_batched_tokens.
	PrefillBusyThreshold *float64
	// PendingTTL, PendingMaxEntries and PendingMaxBytes bound the
	// pending-selection cache.
	PendingTTL        time.Duration
	PendingMaxEntries int
	PendingMaxBytes   int64
	// SessionAffinityTTL enables session affinity when > 0.
	SessionAffinityTTL time.Duration
	// SessionAffinitySoft makes bindings follow the dispatch instead of
	// rejecting a dispatch away from the bound worker.
	SessionAffinitySoft bool
	// SessionTableCap bounds the number of session bindings.
	SessionTableCap int
	// ReservationTTL force-frees bookings older than this (stale requests
	// whose free never came).
	ReservationTTL time.Duration
	// WorkerDownAfter takes a worker out of the candidates, and drops its
	// index entries, when it has been failing (as reported by the proxy:
	// dial errors and 502/503/504 answers, see ReportStatus) for this long
	// with no success in between; 0 disables it. Health is swept every
	// tenth of it; a down worker is probed with GET /health on every sweep
	// and comes back when it answers 2xx. Default 30s: a dead fleet stops
	// taking requests within half a minute, while a worker that fails a
	// few requests (a restart, a blip) is not taken out.
	WorkerDownAfter time.Duration
	// DefaultBlockSize applies to workers registered without block_size.
	DefaultBlockSize uint32
	// MaxWorkers bounds the catalog size; 0 means no bound.
	MaxWorkers int
	// MaxRanksPerWorker bounds a worker's data_parallel_size; a larger one
	// is refused with 422. A worker's ranks are allocated (rank states,
	// and one KV-event listener and socket each), so this bound always
	// holds: 0 means DefaultMaxRanksPerWorker. Default 256: enough for
	// large expert-parallel deployments, while one registration stays a
	// few hundred sockets (10,000 ranks opened 18,848 fds); raise it for
	// more.
	MaxRanksPerWorker int
	// MaxRanks bounds the data-parallel ranks of the whole catalog (every
	// record counts, schedulable or not); a write past it is refused with
	// 409, like a full catalog. 0 means no bound. Default 4096: four times
	// the 1,024-worker scale run, and a few thousand event sockets, well
	// under common file-descriptor limits.
	MaxRanks int
	// MaxReservationsPerRank bounds the live bookings of one rank: a rank
	// at the bound is not a candidate for a new booking, and when no rank
	// is left the booking is refused with 503. 0 means no bound. Default
	// 4096: far above what an engine runs at once (vLLM schedules at most
	// max_num_seqs, 256 to 1024, sequences), so only bookings that are
	// never freed reach it, and they then stop adding load for the
	// reservation TTL (an hour) instead of growing without end.
	MaxReservationsPerRank int
	// MaxReservationsPerClient bounds the live bookings one API client
	// holds (SelectRequest.Client, ReservationRequest.Client; the HTTP
	// handler sets the remote IP); past it a booking is refused with 429.
	// Bookings with an empty Client are exempt: that is the proxy path,
	// whose bookings are bounded by its requests in flight. 0 means no
	// bound. Default 1024: a router booking through the API holds one
	// booking per request it has in flight, a few hundred for a busy one,
	// while a client that never frees stops there (the 3,000
	// unfreed bookings held 6.1M prefill tokens for an hour).
	MaxReservationsPerClient int
	// MaxReservationBlocksPerClient bounds the prompt blocks the live
	// bookings of one API client cover (each kept as a tracking hash and a
	// share of its partition's load trie, up to about 50 bytes a block), so
	// that a client's MaxReservationsPerClient bookings of the longest
	// prompts a body allows do not hold gigabytes for the reservation TTL;
	// past it a booking is refused with 429. The same exemption for an
	// empty Client. 0 means no bound. Default 4,194,304 (at most about
	// 200 MB): 1,024 bookings of 64k-token prompts at 16 tokens a block,
	// where 1,024 bookings of the 4M-token prompts an 8 MiB body can carry
	// held about 6 GB.
	MaxReservationBlocksPerClient int
	// MaxDumpEvents caps the events GET /dump (and Dump) returns over all
	// partitions; a partition the cap cut is marked "truncated": true. 0
	// means no cap. Default 100,000: about 25 MB of JSON, enough to look
	// into an index or seed a small one, while a 2.7M-entry index no
	// longer builds a 655 MB body (which took 2.4 GB more RSS).
	MaxDumpEvents int
	// Rand draws the picker's random numbers in [0, 1); nil uses
	// math/rand/v2. Tests inject a seeded source.
	Rand func() float64
}

// GatewayConfig is DefaultConfig with the gateway's own scoring defaults,
// which keep agentic sessions and prefix families on the worker that holds
// their cache where Dynamo's move them to the least loaded one
// (docs/routing.md has the measurements): each cached block is worth
// eight blocks of prefill load instead of one, that credit is not clipped
// at zero, and prefixes booked in flight count as cached.
func GatewayConfig() Config {
	c := DefaultConfig()
	c.OverlapScoreCredit = 8
	c.InFlightOverlap = true
	c.UnclippedOverlapCredit = true
	return c
}

// DefaultConfig returns Dynamo's defaults, plus bounds
// Dynamo does not have.
func DefaultConfig() Config {
	return Config{
		OverlapScoreCredit: 1.0,
		PrefillLoadScale:   1.0,
		HostCacheHitWeight: 0.75,
		DiskCacheHitWeight: 0.25,
		UseKVEvents:        true,
		TrackActiveBlocks:  true,
		TrackPrefillTokens: true,
		AssumeKVReuse:      true,
		ApproxTTL:          120 * time.Second,
		PendingTTL:         120 * time.Second,
		PendingMaxEntries:  4096,
		PendingMaxBytes:    256 << 20,
		SessionTableCap:    65536,
		ReservationTTL:     3600 * time.Second,
		MaxWorkers:         65536,
		// Not Dynamo's: bounds for a gateway that untrusted clients may
		// reach (each field's comment says why its default).
		WorkerDownAfter:   30 * time.Second,
		MaxRanksPerWorker: DefaultMaxRanksPerWorker,
		MaxRanks:          4096,
		// Outstanding bookings.
		MaxReservationsPerRank:        4096,
		MaxReservationsPerClient:      1024,
		MaxReservationBlocksPerClient: 4 << 20,
		MaxDumpEvents:                 100_000,
	}
}

// Validate rejects knobs Dynamo's builder rejects.
func (c *Config) Validate() error {
	nonNeg := func(name string, v float64) error {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return errors.New(name + " must be finite and non-negative")
		}
		return nil
	}
	for _, kv := range []struct {
		n string
		v float64
	}{
		{"overlap_score_credit", c.OverlapScoreCredit},
		{"overlap_score_credit_decay", c.OverlapScoreCreditDecay},
		{"prefill_load_scale", c.PrefillLoadScale},
		{"decode_active_request_weight", c.DecodeActiveRequestWeight},
		{"host_cache_hit_weight", c.HostCacheHitWeight},
		{"disk_cache_hit_weight", c.DiskCacheHitWeight},
		{"shared_cache_multiplier", c.SharedCacheMultiplier},
		{"router_temperature", c.RouterTemperature},
	} {
		if err := nonNeg(kv.n, kv.v); err != nil {
			return err
		}
	}
	if c.WorkerDownAfter < 0 {
		return errors.New("worker_down_after must not be negative")
	}
	if c.SessionAffinityTTL != 0 && (c.SessionAffinityTTL < time.Second || c.SessionAffinityTTL > 31536000*time.Second) {
		return errors.New("session affinity ttl must be between 1s and 31536000s")
	}
	if c.PendingMaxEntries < 0 || c.PendingMaxBytes < 0 || c.SessionTableCap < 0 || c.MaxWorkers < 0 ||
		c.MaxRanksPerWorker < 0 || c.MaxRanks < 0 || c.MaxReservationsPerRank < 0 || c.MaxReservationsPerClient < 0 ||
		c.MaxReservationBlocksPerClient < 0 || c.MaxDumpEvents < 0 {
		return errors.New("limits must be non-negative")
	}
	return nil
}

func (c *Config) rand() float64 {
	if c.Rand != nil {
		return c.Rand()
	}
	return rand.Float64()
}

// scoring is the resolved per-request view of the knobs: config values with
// the request's overrides applied.
type scoring struct {
	credit, decay, scale, reqWeight, hostW, diskW, shared, temperature float64
	assumeReuse, trackPrefill                                          bool
	// inFlight and unclipped are Config.InFlightOverlap and
	// Config.UnclippedOverlapCredit.
	inFlight, unclipped bool
}

func (c *Config) scoring(o *RouterConfigOverride) (scoring, error) {
	s := scoring{
		credit: c.OverlapScoreCredit, decay: c.OverlapScoreCreditDecay, scale: c.PrefillLoadScale,
		reqWeight: c.DecodeActiveRequestWeight, hostW: c.HostCacheHitWeight, diskW: c.DiskCacheHitWeight,
		shared: c.SharedCacheMultiplier, temperature: c.RouterTemperature,
		assumeReuse: c.AssumeKVReuse, trackPrefill: c.TrackPrefillTokens,
		inFlight: c.InFlightOverlap, unclipped: c.UnclippedOverlapCredit,
	}
	if o == nil {
		return s, nil
	}
	check := func(name string, v *float64, dst *float64) error {
		if v == nil {
			return nil
		}
		if math.IsNaN(*v) || math.IsInf(*v, 0) || *v < 0 {
			return errorf(KindBadRequest, "router_config_override.%s must be finite and non-negative", name)
		}
		*dst = *v
		return nil
	}
	if err := check("overlap_score_credit", o.OverlapScoreCredit, &s.credit); err != nil {
		return s, err
	}
	if o.PrefillLoadScale == nil {
		if err := check("overlap_score_weight", o.OverlapScoreWeight, &s.scale); err != nil {
			return s, err
		}
	}
	if err := check("prefill_load_scale", o.PrefillLoadScale, &s.scale); err != nil {
		return s, err
	}
	if err := check("router_temperature", o.RouterTemperature, &s.temperature); err != nil {
		return s, err
	}
	if err := check("shared_cache_multiplier", o.SharedCacheMultiplier, &s.shared); err != nil {
		return s, err
	}
	if o.AssumeKVReuse != nil {
		s.assumeReuse = *o.AssumeKVReuse
	}
	if o.TrackPrefillTokens != nil {
		s.trackPrefill = *o.TrackPrefillTokens
	}
	return s, nil
}
