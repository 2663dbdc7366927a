package selection

// Wire types of the selection API (docs/selection-api.md). Every prompt-carrying
// request embeds Prompt, so its fields sit at the top level of the JSON body.
// Pointers mark fields whose absence means something different from zero.

// Prompt is the prompt part of a request: either tokens (the preferred path,
// hashed here) or precomputed hashes (the hash path).
type Prompt struct {
	// TokenIDs are the prompt's token ids. The JSON field token_ids is read by
	// the dedicated one-pass decoder (DecodeJSON), never by the generic one.
	// Nil means the field was absent or null.
	TokenIDs []uint32 `json:"-"`
	// MMRoutingInfo is the multimodal routing view; when its
	// routing_token_ids is non-empty it is hashed instead of TokenIDs.
	MMRoutingInfo *MMRoutingInfo `json:"mm_routing_info,omitempty"`
	// BlockMMInfos is per-block multimodal info for the TokenIDs path.
	BlockMMInfos BlockMMInfos `json:"block_mm_infos,omitempty"`
	// BlockHashes are precomputed local block hashes (hash path).
	BlockHashes Hashes `json:"block_hashes,omitempty"`
	// SequenceHashes are precomputed chained sequence hashes (hash path),
	// used to track active load.
	SequenceHashes Hashes `json:"sequence_hashes,omitempty"`
	// ISLTokens is the input length in tokens; required on the hash path.
	ISLTokens *uint64 `json:"isl_tokens,omitempty"`
	// LoraName is the LoRA adapter; it salts the hash seed.
	LoraName string `json:"lora_name,omitempty"`
	// CacheSalt is the cache namespace; it salts the hash seed.
	CacheSalt string `json:"cache_salt,omitempty"`
	// IsEagle selects Eagle hashing; nil means the partition's setting.
	IsEagle *bool `json:"is_eagle,omitempty"`
}

func (p *Prompt) tokenIDs() *[]uint32 { return &p.TokenIDs }

// TokenPrompt is a prompt of token ids alone, with what salts their
// hashes: what the proxy reads of a completions or chat body besides its
// own members. The selection API's other prompt members (block_hashes,
// mm_routing_info, ...) are not among its names, so a proxied body that
// carries them has them skipped, not decoded: decoded, a 15 MB
// block_hashes held some 260 MB while the request lasted.
type TokenPrompt struct {
	// TokenIDs are the prompt's token ids, read as Prompt's are.
	TokenIDs []uint32 `json:"-"`
	// LoraName is the LoRA adapter; it salts the hash seed.
	LoraName string `json:"lora_name,omitempty"`
	// CacheSalt is the cache namespace; it salts the hash seed.
	CacheSalt string `json:"cache_salt,omitempty"`
}

func (p *TokenPrompt) tokenIDs() *[]uint32 { return &p.TokenIDs }

// MMRoutingInfo is the multimodal routing view of a prompt.
type MMRoutingInfo struct {
	// RoutingTokenIDs are the tokens to hash instead of token_ids.
	RoutingTokenIDs TokenList `json:"routing_token_ids,omitempty"`
	// BlockMMInfos is the per-block multimodal info for RoutingTokenIDs.
	BlockMMInfos BlockMMInfos `json:"block_mm_infos,omitempty"`
}

// RouterConfigOverride overrides scheduler knobs for one request
// (docs/selection-api.md, "The prompt").
type RouterConfigOverride struct {
	OverlapScoreCredit    *float64 `json:"overlap_score_credit,omitempty"`
	PrefillLoadScale      *float64 `json:"prefill_load_scale,omitempty"`
	OverlapScoreWeight    *float64 `json:"overlap_score_weight,omitempty"` // deprecated alias of prefill_load_scale
	RouterTemperature     *float64 `json:"router_temperature,omitempty"`
	AssumeKVReuse         *bool    `json:"assume_kv_reuse,omitempty"`
	TrackPrefillTokens    *bool    `json:"track_prefill_tokens,omitempty"`
	SharedCacheMultiplier *float64 `json:"shared_cache_multiplier,omitempty"`
}

// SessionContext is the structured session info; it wins over session_id.
type SessionContext struct {
	SessionID       string `json:"session_id"`
	ParentSessionID string `json:"parent_session_id,omitempty"`
	SessionFinal    bool   `json:"session_final,omitempty"`
	InputTrigger    string `json:"input_trigger,omitempty"`
}

// AffinityTarget is a soft preference for a worker (any rank when DPRank is nil).
type AffinityTarget struct {
	WorkerID uint64  `json:"worker_id"`
	DPRank   *uint32 `json:"dp_rank,omitempty"`
}

// PinnedWorker is a hard pin to one rank.
type PinnedWorker struct {
	WorkerID uint64 `json:"worker_id"`
	DPRank   uint32 `json:"dp_rank"`
}

// RoutingConstraints filter and bias candidates by worker taints.
type RoutingConstraints struct {
	RequiredTaints  RequiredTaints  `json:"required_taints,omitempty"`
	PreferredTaints PreferredTaints `json:"preferred_taints,omitempty"`
}

// Placement holds the session and placement fields of select-like requests.
type Placement struct {
	SessionID          string              `json:"session_id,omitempty"`
	SessionContext     *SessionContext     `json:"session_context,omitempty"`
	AffinityTarget     *AffinityTarget     `json:"affinity_target,omitempty"`
	PinnedWorker       *PinnedWorker       `json:"pinned_worker,omitempty"`
	AllowedWorkerIDs   WorkerIDs           `json:"allowed_worker_ids,omitempty"`
	RoutingConstraints *RoutingConstraints `json:"routing_constraints,omitempty"`
	// ExcludeRanks removes ranks from the candidates. It is not part of the
	// wire format: the proxy uses it to fail over to a worker it has not
	// tried yet.
	ExcludeRanks []Rank `json:"-"`
	// AllowedSet, when set, keeps the candidates to these workers, as
	// AllowedWorkerIDs does, from a set the caller made once and shares
	// between requests (the selection only reads it), so that a request
	// allocates nothing for it. Not part of the wire format: the proxy's
	// context filter sets it. It is used instead of AllowedWorkerIDs.
	AllowedSet map[uint64]bool `json:"-"`
}

// session returns the effective session id: session_context wins.
func (p *Placement) session() string {
	if p.SessionContext != nil && p.SessionContext.SessionID != "" {
		return p.SessionContext.SessionID
	}
	return p.SessionID
}

// Partition names the (model_name, routing_group) a request addresses.
// tenant_id is read as the older name of routing_group.
type Partition struct {
	ModelName    string `json:"model_name,omitempty"`
	RoutingGroup string `json:"routing_group,omitempty"`
	TenantID     string `json:"tenant_id,omitempty"`
}

// Key returns the partition key with Dynamo's defaults applied.
func (p *Partition) Key() PartitionKey {
	k := PartitionKey{Model: p.ModelName, Group: p.RoutingGroup}
	if k.Group == "" {
		k.Group = p.TenantID
	}
	return k.withDefaults()
}

// SelectRequest is the body of POST /select and /select_and_reserve.
type SelectRequest struct {
	Partition
	Prompt
	Placement
	// SelectionID is echoed; on /select it keys the pending cache, on
	// /select_and_reserve it keys the booking (a UUIDv4 when absent).
	SelectionID          string                `json:"selection_id,omitempty"`
	RouterConfigOverride *RouterConfigOverride `json:"router_config_override,omitempty"`
	ExpectedOutputTokens *uint32               `json:"expected_output_tokens,omitempty"`
	PriorityJump         float64               `json:"priority_jump,omitempty"`
	StrictPriority       uint32                `json:"strict_priority,omitempty"`
	// Advisory adds worker_load to a /select response.
	Advisory bool `json:"advisory,omitempty"`
	// Lean leaves out of the response what only the selection API reports
	// (the per-rank overlap map and, on a booking, the sequence hashes,
	// which the booking then keeps in a pooled buffer: hashbuf.go). Not
	// part of the wire format: the proxy path sets it to save allocations
	// on every request.
	Lean bool `json:"-"`
	// RecordOnAnswer, in approximate mode, records the booked prompt as
	// cached on its rank only once the worker answers 2xx
	// (Reservation.Answered) and sends its first byte
	// (Reservation.PrefillDone), not when it is booked: a prompt the
	// engine refused (a 400), a rank that failed and was replaced, or a
	// stream whose client left after its headers, caches nothing. Not part
	// of the wire format: the proxy path sets it; the selection API
	// records on booking, as Dynamo does.
	RecordOnAnswer bool `json:"-"`
	// Client identifies who books, for Config.MaxReservationsPerClient.
	// Not part of the wire format: api.Handler sets the remote IP; empty (the
	// proxy path) is exempt from the bound.
	Client string `json:"-"`
}

// ReservationRequest is the body of POST /reservations.
type ReservationRequest struct {
	Partition
	Prompt
	Placement
	SelectionID            *string               `json:"selection_id"`
	WorkerID               *uint64               `json:"worker_id,omitempty"`
	DPRank                 *uint32               `json:"dp_rank,omitempty"`
	RouterConfigOverride   *RouterConfigOverride `json:"router_config_override,omitempty"`
	ExpectedOutputTokens   *uint32               `json:"expected_output_tokens,omitempty"`
	EffectivePrefillTokens *uint64               `json:"effective_prefill_tokens,omitempty"`
	TrackPrefillTokens     *bool                 `json:"track_prefill_tokens,omitempty"`
	// Client identifies who books, as SelectRequest.Client does.
	Client string `json:"-"`
}

// ScoreRequest is the body of POST /potential_loads and /overlap_scores.
type ScoreRequest struct {
	Partition
	Prompt
	RouterConfigOverride *RouterConfigOverride `json:"router_config_override,omitempty"`
}

// OutputBlockRequest is the optional body of POST /reservations/{id}/output_block.
type OutputBlockRequest struct {
	DecayFraction *float64 `json:"decay_fraction,omitempty"`
}

// Overlap summarises the cache hit of a selection, in tokens
// (docs/selection-api.md, "Selecting").
type Overlap struct {
	LongestMatched uint64            `json:"longest_matched"`
	GPU            uint64            `json:"gpu"`
	DP             map[string]uint64 `json:"dp"`
	CPU            uint64            `json:"cpu"`
	Disk           uint64            `json:"disk"`
}

// WorkerLoad is the advisory load report of a /select response.
type WorkerLoad struct {
	ActivePrefillTokens uint64 `json:"active_prefill_tokens"`
	// PrefillTokenCapacity is the worker's max_num_batched_tokens, or
	// DefaultPrefillCapacity when it registered none: always a number, as
	// Dynamo's clients read it.
	PrefillTokenCapacity uint64  `json:"prefill_token_capacity"`
	TotalKVBlocks        *uint64 `json:"total_kv_blocks,omitempty"`
	PrefillBusy          *bool   `json:"prefill_busy,omitempty"`
}

// DefaultPrefillCapacity is the prefill capacity reported for a worker
// registered without max_num_batched_tokens. Dynamo reports the same
// number there: large enough that such a worker is never prefill-busy.
const DefaultPrefillCapacity = 10_000_000

// SelectResponse is the answer of /select and /select_and_reserve.
type SelectResponse struct {
	SelectionID            string      `json:"selection_id,omitempty"`
	SequenceHashes         Hashes      `json:"sequence_hashes,omitzero"` // a booking's, [] for a prompt under one block
	ISLTokens              *uint64     `json:"isl_tokens,omitempty"`
	TrackPrefillTokens     *bool       `json:"track_prefill_tokens,omitempty"`
	ModelName              string      `json:"model_name"`
	RoutingGroup           string      `json:"routing_group"`
	WorkerID               uint64      `json:"worker_id"`
	DPRank                 uint32      `json:"dp_rank"`
	Endpoint               string      `json:"endpoint"`
	BlockSize              uint32      `json:"block_size"`
	Overlap                Overlap     `json:"overlap"`
	EffectivePrefillTokens uint64      `json:"effective_prefill_tokens"`
	PotentialDecodeBlocks  uint64      `json:"potential_decode_blocks"`
	DecodeBusy             *bool       `json:"decode_busy,omitempty"`
	WorkerLoad             *WorkerLoad `json:"worker_load,omitempty"`
	// CachedTokens is the device-tier hit in tokens for the chosen rank. It is
	// kept for in-process callers (the proxy's response headers) and never
	// serialized: Dynamo removed cached_tokens from the wire.
	CachedTokens uint64 `json:"-"`
	// ExpectedCachedTokens is what the engine should find cached when it
	// admits the request: the device-tier hit, or the blocks of the
	// prompt that requests booked on the rank before it hold, if more
	// (they are prefilled, and cached, ahead of it). In-process only,
	// like CachedTokens; the proxy checks it against the engine's usage.
	ExpectedCachedTokens uint64 `json:"-"`
	// Candidates is the per-rank breakdown, filled only when asked for
	// (Explain); never serialized on the selection API.
	Candidates []Candidate `json:"-"`

	// record is the booking's deferred record (RecordOnAnswer), nil once
	// recorded or when there is none.
	record *bookingRecord
}

// Candidate is one rank's row of a selection, for explain output.
type Candidate struct {
	WorkerID      uint64
	DPRank        uint32
	DeviceBlocks  uint32
	PrefillTokens uint64
	DecodeBlocks  uint64
	Cost          float64
}

// ReservationResponse is the answer of POST /reservations.
type ReservationResponse struct {
	SelectionID  string `json:"selection_id"`
	ModelName    string `json:"model_name"`
	RoutingGroup string `json:"routing_group"`
	WorkerID     uint64 `json:"worker_id"`
	DPRank       uint32 `json:"dp_rank"`
	Endpoint     string `json:"endpoint"`
}

// PotentialLoad is one rank's (potential) load.
type PotentialLoad struct {
	WorkerID               uint64 `json:"worker_id"`
	DPRank                 uint32 `json:"dp_rank"`
	PotentialPrefillTokens uint64 `json:"potential_prefill_tokens"`
	PotentialDecodeBlocks  uint64 `json:"potential_decode_blocks"`
	ActiveRequests         uint64 `json:"active_requests"`
}

// ModelLoadResponse is one partition's entry of GET /loads.
type ModelLoadResponse struct {
	ModelName        string          `json:"model_name"`
	RoutingGroup     string          `json:"routing_group"`
	Loads            []PotentialLoad `json:"loads"`
	PendingCount     uint64          `json:"pending_count"`
	PendingISLTokens uint64          `json:"pending_isl_tokens"`
}

// OverlapScoresResponse is the answer of POST /overlap_scores.
type OverlapScoresResponse struct {
	BlockSize   uint32         `json:"block_size"`
	NumBlocks   uint64         `json:"num_blocks"`
	Workers     []OverlapScore `json:"workers"`
	SharedCache SharedCache    `json:"shared_cache"`
}

// OverlapScore is one rank's tiered overlap.
type OverlapScore struct {
	WorkerID                  uint64  `json:"worker_id"`
	DPRank                    uint32  `json:"dp_rank"`
	DeviceBlocks              uint32  `json:"device_blocks"`
	HostPinnedBlocks          uint32  `json:"host_pinned_blocks"`
	DiskBlocks                uint32  `json:"disk_blocks"`
	HostPinnedExtensionBlocks uint32  `json:"host_pinned_extension_blocks"`
	DiskExtensionBlocks       uint32  `json:"disk_extension_blocks"`
	SharedBeyondDeviceBlocks  *uint32 `json:"shared_beyond_device_blocks"`
	RouterCreditBlocks        float64 `json:"router_credit_blocks"`
}

// SharedCache reports the shared-cache lookup; no shared cache is wired in,
// so it is always disabled.
type SharedCache struct {
	Enabled        bool        `json:"enabled"`
	TotalHitBlocks uint64      `json:"total_hit_blocks"`
	Ranges         [][2]uint64 `json:"ranges"`
	Error          *string     `json:"error"`
}

// ReadyResponse is the answer of GET /ready.
type ReadyResponse struct {
	Ready              bool           `json:"ready"`
	SchedulableWorkers int            `json:"schedulable_workers"`
	Workers            []WorkerRecord `json:"workers"`
}
