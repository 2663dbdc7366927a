package main

import (
	"errors"
	"fmt"
	"time"
)

// config is a run's setup: the fleet, the engines, the workload, the
// window measured and the policies. Defaults are the seed setup
// (docs/kvsim.md says why each value).
type config struct {
	Seed uint64 `json:"seed"`

	// The fleet.
	Workers          int           `json:"workers"`
	BlockSize        int           `json:"block_size"`
	KVBlocks         int           `json:"kv_blocks"`
	PrefillRate      float64       `json:"prefill_rate"`
	DecodeTime       time.Duration `json:"decode_time_ns"`
	MaxBatchedTokens int           `json:"max_batched_tokens"`
	MaxNumSeqs       int           `json:"max_num_seqs"`
	// EventDelay is how long an engine's KV events take to reach the index.
	EventDelay time.Duration `json:"event_delay_ns"`
	// IndexMaxMemory bounds the index as index_max_memory does (2 GiB).
	IndexMaxMemory int64 `json:"index_max_memory"`

	// The seed workload: agentic sessions.
	Sessions     int           `json:"sessions,omitempty"`
	SystemPrompt int           `json:"system_prompt_tokens,omitempty"`
	StartMin     int           `json:"start_min_tokens,omitempty"`
	StartMax     int           `json:"start_max_tokens,omitempty"`
	EndMin       int           `json:"end_min_tokens,omitempty"`
	EndMax       int           `json:"end_max_tokens,omitempty"`
	UserMin      int           `json:"user_min_tokens,omitempty"`
	UserMax      int           `json:"user_max_tokens,omitempty"`
	OutputMin    int           `json:"output_min_tokens,omitempty"`
	OutputMax    int           `json:"output_max_tokens,omitempty"`
	ThinkMin     time.Duration `json:"think_min_ns,omitempty"`
	ThinkMax     time.Duration `json:"think_max_ns,omitempty"`
	Ramp         time.Duration `json:"ramp_ns,omitempty"`

	// The trace workload.
	Trace         string  `json:"trace,omitempty"`
	TraceRequests int     `json:"trace_requests,omitempty"`
	Speed         float64 `json:"speed,omitempty"`
	MaxModelLen   int     `json:"max_model_len,omitempty"`

	// The window measured, [Warmup, Duration), and the load buckets in it.
	Warmup   time.Duration `json:"warmup_ns"`
	Duration time.Duration `json:"duration_ns"`
	Buckets  int           `json:"buckets"`
	// Drain is how long a trace run goes on after its window, for the
	// requests still in flight to finish.
	Drain time.Duration `json:"drain_ns,omitempty"`
}

// end is the virtual instant the run stops.
func (c *config) end() time.Duration { return c.Duration + c.Drain }

// Bounds on what the command line sets: the simulation allocates per
// worker, per session and per block, so each has a ceiling.
const (
	maxWorkers  = 4096 // the router's default max_ranks
	maxSessions = 1 << 20
	maxKVBlocks = 1 << 22
	maxBuckets  = 1000
)

func (c *config) validate() error {
	switch {
	case c.Workers < 1 || c.Workers > maxWorkers:
		return fmt.Errorf("--workers %d: between 1 and %d", c.Workers, maxWorkers)
	case c.BlockSize < 1 || c.BlockSize > 4096:
		return errors.New("--block-size: between 1 and 4096")
	case c.KVBlocks < 1 || c.KVBlocks > maxKVBlocks:
		return fmt.Errorf("--kv-blocks: between 1 and %d", maxKVBlocks)
	case !(c.PrefillRate > 0):
		return errors.New("--prefill-rate must be positive")
	case c.DecodeTime < 0 || c.EventDelay < 0:
		return errors.New("--decode-time and --event-delay must not be negative")
	case c.MaxBatchedTokens < 1 || c.MaxNumSeqs < 1:
		return errors.New("--max-batched-tokens and --max-num-seqs must be at least 1")
	case c.Buckets < 1 || c.Buckets > maxBuckets:
		return fmt.Errorf("--buckets: between 1 and %d", maxBuckets)
	case c.Warmup < 0 || c.Duration <= c.Warmup:
		return errors.New("--duration must exceed --warmup")
	}
	if c.Trace != "" {
		if !(c.Speed > 0) {
			return errors.New("--speed must be positive")
		}
		return nil
	}
	switch {
	case c.Sessions < 1 || c.Sessions > maxSessions:
		return fmt.Errorf("--sessions: between 1 and %d", maxSessions)
	case c.StartMin < 1 || c.StartMax < c.StartMin || c.EndMin < c.StartMax || c.EndMax < c.EndMin:
		return errors.New("session lengths: need 1 <= start-min <= start-max <= end-min <= end-max")
	case c.UserMin < 0 || c.UserMax < c.UserMin || c.OutputMin < 1 || c.OutputMax < c.OutputMin:
		return errors.New("turn lengths: need 0 <= user-min <= user-max and 1 <= output-min <= output-max")
	case c.ThinkMin < 0 || c.ThinkMax < c.ThinkMin || c.Ramp < 0:
		return errors.New("think times and ramp must be ordered and not negative")
	case (c.EndMax+c.OutputMax+c.UserMax+c.BlockSize-1)/c.BlockSize > c.KVBlocks:
		return errors.New("a session's longest turn would not fit one worker's cache: raise --kv-blocks")
	}
	return nil
}
