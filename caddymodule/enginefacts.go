package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// EngineFactsConfig is how the kv_router app reads its workers' engines
// (docs/engine-facts.md): every worker with an HTTP endpoint is asked,
// soon after it appears or changes and then periodically, for its served
// models, LoRA adapters, context length, block size and KV blocks, which
// fill in what its registration left out (Catalog.ApplyEngineFacts). A
// worker whose engine runs another block size than it was declared with
// is routed by load only, and the log says so. The fields sit at the top
// level of the kv_router app (the struct is embedded).
type EngineFactsConfig struct {
	// EngineFacts turns the reading of the workers' engines on or off.
	// Default: on.
	EngineFacts *bool `json:"engine_facts,omitempty"`

	// EngineFactsInterval is how often each worker's engine is read; an
	// engine that did not answer is asked again after at most 5s. At least
	// 1s: each reading is two calls to every engine. Default: 30s.
	EngineFactsInterval caddy.Duration `json:"engine_facts_interval,omitempty"`

	// EngineFactsTimeout bounds each call to an engine (two per reading).
	// Default: 5s.
	EngineFactsTimeout caddy.Duration `json:"engine_facts_timeout,omitempty"`
}

// Defaults and fixed bounds of the reader.
const (
	defaultEngineFactsInterval = 30 * time.Second
	defaultEngineFactsTimeout  = 5 * time.Second
	// engineFactsRetry is the longest wait before an engine that did not
	// answer (still loading its model, say) is asked again.
	engineFactsRetry = 5 * time.Second
	// engineFactsPoll is how often the catalog's version is looked at: a
	// new or changed worker is read within it.
	engineFactsPoll = time.Second
	// engineFactsConcurrency bounds the engines read at once.
	engineFactsConcurrency = 8
	// minEngineFactsInterval is engine_facts_interval's floor.
	minEngineFactsInterval = time.Second
)

// validate refuses negative durations, and an interval below its floor.
func (c *EngineFactsConfig) validate() error {
	if c.EngineFactsInterval < 0 {
		return errors.New("engine_facts_interval must not be negative")
	}
	if c.EngineFactsInterval > 0 && time.Duration(c.EngineFactsInterval) < minEngineFactsInterval {
		// An operator probe set 1ms: 1,100 engine reads a second against
		// four workers, the gateway's own load on its engines.
		return fmt.Errorf("engine_facts_interval %v is below %v: each reading is two calls to every engine",
			time.Duration(c.EngineFactsInterval), minEngineFactsInterval)
	}
	if c.EngineFactsTimeout < 0 {
		return errors.New("engine_facts_timeout must not be negative")
	}
	return nil
}

// unmarshalCaddyfile reads one of the options at d, reporting whether
// the option was one of them.
func (c *EngineFactsConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) (bool, error) {
	var err error
	switch d.Val() {
	case "engine_facts":
		c.EngineFacts, err = parseBool(d)
	case "engine_facts_interval":
		c.EngineFactsInterval, err = parseDuration(d)
	case "engine_facts_timeout":
		c.EngineFactsTimeout, err = parseDuration(d)
	default:
		return false, nil
	}
	if err == nil {
		err = c.validate()
	}
	return true, err
}

// start starts reading the engines of catalog's workers; nil when off.
func (c *EngineFactsConfig) start(catalog *selection.Catalog, logger *zap.Logger) *engineReader {
	if c.EngineFacts != nil && !*c.EngineFacts {
		return nil
	}
	interval, timeout := time.Duration(c.EngineFactsInterval), time.Duration(c.EngineFactsTimeout)
	if interval == 0 {
		interval = defaultEngineFactsInterval
	}
	if timeout == 0 {
		timeout = defaultEngineFactsTimeout
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &engineReader{catalog: catalog, probe: newEngineProbe(timeout), interval: interval, log: logger,
		cancel: cancel, done: make(chan struct{}), workers: map[uint64]*engineWorker{}}
	go e.run(ctx)
	return e
}

// engineReader is the goroutine that reads the engines, from the app's
// Start to its Stop.
type engineReader struct {
	catalog  *selection.Catalog
	probe    *engineProbe
	interval time.Duration
	log      *zap.Logger
	cancel   context.CancelFunc
	done     chan struct{}

	// The rest belongs to the goroutine.
	workers map[uint64]*engineWorker
	version uint64    // the catalog version the workers were last listed at
	nextDue time.Time // the earliest next reading
}

// engineWorker is what the reader keeps of one worker.
type engineWorker struct {
	endpoint string
	next     time.Time // when to read it next
	warned   []string  // the warnings logged for its last reading, so each is logged once
}

// stop stops the reader and waits for it, its calls in flight cancelled.
func (e *engineReader) stop() {
	if e == nil {
		return
	}
	e.cancel()
	<-e.done
}

func (e *engineReader) run(ctx context.Context) {
	defer close(e.done)
	t := time.NewTicker(min(engineFactsPoll, e.interval))
	defer t.Stop()
	for {
		e.round(ctx, time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// engineTask is one reading to make.
type engineTask struct {
	id       uint64
	endpoint string
	reading  engineReading
	rec      selection.WorkerRecord // after the facts were applied
	changed  bool
	err      error // the catalog refused some of the facts
}

// round reads the engines that are due: those of workers new or changed
// since the last round, and those last read an interval ago.
func (e *engineReader) round(ctx context.Context, now time.Time) {
	v := e.catalog.Version()
	if v == e.version && now.Before(e.nextDue) {
		return
	}
	e.version = v
	tasks := e.due(now)
	sem := make(chan struct{}, engineFactsConcurrency)
	var wg sync.WaitGroup
	for i := range tasks {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			e.read(ctx, &tasks[i])
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	done := time.Now()
	for i := range tasks {
		e.report(&tasks[i], done)
	}
	e.nextDue = done.Add(e.interval)
	for _, w := range e.workers {
		if w.next.Before(e.nextDue) {
			e.nextDue = w.next
		}
	}
}

// due lists the catalog's workers, forgets those gone, and returns the
// readings to make now.
func (e *engineReader) due(now time.Time) []engineTask {
	var tasks []engineTask
	seen := map[uint64]bool{}
	for _, rec := range e.catalog.ListWorkers("", "") {
		if rec.Endpoint == nil || *rec.Endpoint == "" {
			continue
		}
		seen[rec.WorkerID] = true
		w := e.workers[rec.WorkerID]
		if w == nil || w.endpoint != *rec.Endpoint {
			w = &engineWorker{endpoint: *rec.Endpoint}
			e.workers[rec.WorkerID] = w
		}
		if !now.Before(w.next) {
			tasks = append(tasks, engineTask{id: rec.WorkerID, endpoint: w.endpoint})
		}
	}
	for id := range e.workers {
		if !seen[id] {
			delete(e.workers, id)
		}
	}
	return tasks
}

// read reads one engine and applies what it learned at once, so that a
// slow engine elsewhere does not hold the others' facts back.
func (e *engineReader) read(ctx context.Context, t *engineTask) {
	t.reading = e.probe.read(ctx, t.endpoint)
	if t.reading.failed() || ctx.Err() != nil {
		return
	}
	t.rec, t.changed, t.err = e.catalog.ApplyEngineFacts(t.id, t.endpoint, &t.reading.facts)
}

// report schedules the worker's next reading, counts the reading and
// logs what it found, each warning once while it lasts.
func (e *engineReader) report(t *engineTask, now time.Time) {
	w := e.workers[t.id]
	if w == nil || w.endpoint != t.endpoint {
		return // the worker left or moved while it was read
	}
	r := &t.reading
	if r.failed() {
		engineReadsTotal.WithLabelValues("failed").Inc()
		w.next = now.Add(min(e.interval, engineFactsRetry))
		if c := e.log.Check(zap.DebugLevel, "engine facts not read"); c != nil {
			c.Write(zap.Uint64("worker_id", t.id), zap.String("endpoint", t.endpoint), zap.Errors("errors", r.errs))
		}
		return
	}
	w.next = now.Add(e.interval)
	engineReadsTotal.WithLabelValues(readOutcome(r)).Inc()
	if len(r.errs) > 0 {
		if c := e.log.Check(zap.DebugLevel, "engine facts partly read"); c != nil {
			c.Write(zap.Uint64("worker_id", t.id), zap.String("endpoint", t.endpoint), zap.Errors("errors", r.errs))
		}
	}
	if t.changed {
		e.log.Info("engine facts applied", zap.Uint64("worker_id", t.id), zap.String("model_name", t.rec.ModelName),
			zap.Uint32p("block_size", t.rec.BlockSize), zap.Uint32p("engine_block_size", t.rec.EngineBlockSize),
			zap.Uint64p("total_kv_blocks", t.rec.TotalKVBlocks), zap.Uint64p("max_model_len", t.rec.MaxModelLen),
			zap.Strings("lora_adapters", t.rec.LoraAdapters))
	}
	warnings := e.warnings(t)
	for _, msg := range warnings {
		if slices.Contains(w.warned, msg) {
			continue
		}
		e.log.Warn(msg, zap.Uint64("worker_id", t.id), zap.String("endpoint", t.endpoint),
			zap.String("model_name", t.rec.ModelName), zap.Strings("engine_models", r.facts.Models),
			zap.Uint32p("block_size", t.rec.BlockSize), zap.Uint32("engine_block_size", r.facts.BlockSize),
			zap.Strings("details", r.notes), zap.NamedError("refused", t.err))
	}
	w.warned = warnings
}

// warnings are what an operator should hear about a worker's reading.
func (e *engineReader) warnings(t *engineTask) []string {
	var out []string
	if t.rec.Endpoint == nil || *t.rec.Endpoint != t.endpoint {
		return nil // the worker left or moved while it was read: nothing was applied
	}
	if t.err != nil {
		out = append(out, "the catalog refused some of the engine's facts: "+t.err.Error())
	}
	if t.err == nil && t.rec.EngineBlockSize != nil && t.rec.BlockSize != nil && *t.rec.EngineBlockSize != *t.rec.BlockSize {
		out = append(out, "the worker's engine runs another block size than the worker was declared with: routing it by load only, not by its cache")
	}
	if ms := t.reading.facts.Models; t.err == nil && len(ms) > 0 && !slices.Contains(ms, t.rec.ModelName) {
		out = append(out, "the worker's engine does not serve the model the worker was declared with: it will refuse that model's requests")
	}
	if len(t.reading.notes) > 0 {
		out = append(out, "the engine's answer held more than the catalog takes")
	}
	return out
}

// readOutcome names a reading that learned something for the metric.
func readOutcome(r *engineReading) string {
	if len(r.errs) > 0 {
		return "partial"
	}
	return "ok"
}
