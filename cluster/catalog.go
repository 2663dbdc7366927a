package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// The catalog bucket: workers registered, changed or removed through one
// replica's selection API are written to a JetStream key-value bucket
// (<prefix with _ for .>_catalog; key: the worker id; value: a catalogValue)
// and every replica watches it, applying what it did not write itself.
// Watching from the start replays the bucket, so a replica that starts
// later, or comes back after an outage, gets the catalog. Writes wait in a
// bounded table (pending) until NATS takes them, so the API never waits for
// NATS and a write made while it was away is shared on its return.

// catalogValue is one bucket entry: the worker's registration as the
// selection API takes it, or a deletion, stamped like every message with
// its writer's name, settings fingerprint and build. A deletion is written
// as a value, not a bucket delete, so that it carries the stamp too.
type catalogValue struct {
	Origin      string                   `json:"origin"`
	Fingerprint uint64                   `json:"fingerprint"`
	Version     string                   `json:"version"`
	Deleted     bool                     `json:"deleted,omitempty"`
	Worker      *selection.WorkerRequest `json:"worker,omitempty"`
}

// Bounds of the catalog sync that the config does not name.
const (
	maxPendingCatalog = 65536 // writes waiting for NATS; past it a write stays local (dropped, counted)
	catalogOpTimeout  = 2 * time.Second
	catalogRetry      = time.Second
)

// catalogSync is the replica's side of the bucket.
type catalogSync struct {
	r    *Replica
	wake chan struct{}

	mu      sync.Mutex
	pending map[string][]byte // key -> value to put, newest write per worker
	// synced are the workers whose record here came from the API or the
	// bucket: only they are removed by a deletion from the bucket (a worker
	// this gateway declares or discovers stays its own).
	synced map[uint64]bool

	// open is 1 while the bucket is watched; reopen asks the loop to open it.
	open      atomic.Bool
	reopen    atomic.Bool
	warnedOff atomic.Bool // "JetStream unavailable" was logged
}

func newCatalogSync(r *Replica) *catalogSync {
	return &catalogSync{r: r, wake: make(chan struct{}, 1), pending: map[string][]byte{}, synced: map[uint64]bool{}}
}

// bucketName derives the bucket from the subject prefix (dots are not
// allowed in a bucket name; the prefix's tokens are checked otherwise).
func bucketName(prefix string) string { return strings.ReplaceAll(prefix, ".", "_") + "_catalog" }

func (c *catalogSync) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// WorkerWritten implements selection.CatalogSink.
func (r *Replica) WorkerWritten(reg *selection.WorkerRequest) {
	if reg.WorkerID == nil {
		return
	}
	id := *reg.WorkerID
	r.cat.mu.Lock()
	r.cat.synced[id] = true
	r.cat.mu.Unlock()
	r.cat.queue(id, &catalogValue{Worker: reg})
}

// WorkerDeleted implements selection.CatalogSink.
func (r *Replica) WorkerDeleted(id uint64) {
	r.cat.mu.Lock()
	delete(r.cat.synced, id)
	r.cat.mu.Unlock()
	r.cat.queue(id, &catalogValue{Deleted: true})
}

// queue stamps v and leaves it for the loop to put.
func (c *catalogSync) queue(id uint64, v *catalogValue) {
	cfg := &c.r.cfg
	v.Origin, v.Fingerprint, v.Version = cfg.Name, cfg.Fingerprint, cfg.Version
	data, err := json.Marshal(v)
	if err != nil || len(data) > cfg.MaxCatalogValueBytes {
		c.r.ctr.drop("catalog_oversize")
		return
	}
	key := strconv.FormatUint(id, 10)
	c.mu.Lock()
	_, replacing := c.pending[key]
	if !replacing && len(c.pending) >= maxPendingCatalog {
		c.mu.Unlock()
		c.r.ctr.drop("queue_full")
		return
	}
	c.pending[key] = data
	c.mu.Unlock()
	c.poke()
}

// run opens the bucket while NATS is reachable, watches it, and puts the
// pending writes; it returns when the replica stops.
func (c *catalogSync) run() {
	var kv jetstream.KeyValue
	var stopWatch context.CancelFunc = func() {}
	var watchDone chan struct{}
	retry := time.NewTimer(catalogRetry)
	defer func() {
		stopWatch()
		if watchDone != nil {
			<-watchDone
		}
		retry.Stop()
	}()
	for {
		select {
		case <-c.r.stop:
			return
		case <-c.wake:
		case <-retry.C:
		}
		retry.Reset(catalogRetry)
		if !c.r.connected.Load() {
			continue
		}
		if c.reopen.Swap(false) || kv == nil {
			stopWatch()
			if watchDone != nil {
				<-watchDone
				watchDone = nil
			}
			c.open.Store(false)
			var err error
			if kv, err = c.openBucket(); err != nil {
				kv = nil
				c.unavailable(err)
				continue
			}
			ctx, cancel := context.WithCancel(context.Background())
			stopWatch = cancel
			w, err := kv.WatchAll(ctx)
			if err != nil {
				cancel()
				kv = nil
				c.unavailable(err)
				continue
			}
			c.open.Store(true)
			c.warnedOff.Store(false)
			watchDone = make(chan struct{})
			go func() { defer close(watchDone); c.watch(ctx, w) }()
		}
		c.flush(kv)
	}
}

// openBucket creates the bucket, or opens it as it is.
func (c *catalogSync) openBucket() (jetstream.KeyValue, error) {
	js, err := jetstream.New(c.r.nc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), catalogOpTimeout)
	defer cancel()
	name := bucketName(c.r.cfg.Prefix)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: name, History: 1,
		MaxValueSize: int32(c.r.cfg.MaxCatalogValueBytes), Storage: jetstream.FileStorage})
	if errors.Is(err, jetstream.ErrBucketExists) {
		return js.KeyValue(ctx, name)
	}
	return kv, err
}

// unavailable notes that the bucket cannot be used (no JetStream on the
// server, most often): bookings and leases are still shared, the catalog
// is not. It is logged once per connection and retried on the next one.
func (c *catalogSync) unavailable(err error) {
	c.r.ctr.catalogUnavailable.Add(1)
	if !c.warnedOff.Swap(true) {
		c.r.log.Warn("catalog bucket unavailable (is JetStream enabled on the NATS server?): bookings and leases are shared, API catalog writes stay on this replica",
			zap.String("replica", c.r.cfg.Name), zap.String("bucket", bucketName(c.r.cfg.Prefix)), zap.Error(err))
	}
	// Wait for the next connection rather than retrying every second.
	c.reopen.Store(false)
	for {
		select {
		case <-c.r.stop:
			return
		case <-c.wake:
			if c.reopen.Load() {
				c.poke()
				return
			}
		}
	}
}

// flush puts the pending writes; a write that fails stays for the next
// round (NATS away, or the server busy).
func (c *catalogSync) flush(kv jetstream.KeyValue) {
	c.mu.Lock()
	todo := make(map[string][]byte, len(c.pending))
	for k, v := range c.pending {
		todo[k] = v
	}
	c.mu.Unlock()
	for key, data := range todo {
		ctx, cancel := context.WithTimeout(context.Background(), catalogOpTimeout)
		_, err := kv.Put(ctx, key, data)
		cancel()
		if err != nil {
			c.r.ctr.drop("publish_error")
			return
		}
		c.r.ctr.catalogPublished.Add(1)
		c.mu.Lock()
		if cur, ok := c.pending[key]; ok && string(cur) == string(data) {
			delete(c.pending, key)
		}
		c.mu.Unlock()
	}
}

// watch applies the bucket's entries until ctx ends: first those it holds,
// then every write as it is made.
func (c *catalogSync) watch(ctx context.Context, w jetstream.KeyWatcher) {
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e != nil { // nil marks the end of the replay
				c.apply(e)
			}
		}
	}
}

// apply brings the catalog to one bucket entry, unless it is there
// already (this replica's own writes come back this way too).
func (c *catalogSync) apply(e jetstream.KeyValueEntry) {
	r := c.r
	id, err := strconv.ParseUint(e.Key(), 10, 64)
	if err != nil {
		r.ctr.drop("catalog_malformed")
		return
	}
	if e.Operation() != jetstream.KeyValuePut { // a delete or purge by an operator's tool
		c.remove(id)
		return
	}
	if len(e.Value()) > r.cfg.MaxCatalogValueBytes {
		r.ctr.drop("catalog_oversize")
		return
	}
	var v catalogValue
	if err := json.Unmarshal(e.Value(), &v); err != nil || len(v.Origin) > maxNameBytes ||
		(!v.Deleted && (v.Worker == nil || v.Worker.WorkerID == nil || *v.Worker.WorkerID != id)) {
		r.ctr.drop("catalog_malformed")
		return
	}
	// Whatever its writer's settings and build: an entry is a worker's
	// registration as the selection API takes it, which the catalog checks
	// itself (catalog_rejected). Refused for another fingerprint, an entry
	// outlived the settings it was written under: once every replica's
	// settings (or build) changed, each kept only the entries it wrote
	// itself, for good.
	if v.Deleted {
		c.remove(id)
		return
	}
	cat := r.router.Catalog()
	if cur, ok := cat.Worker(id); ok {
		reg := cur.Registration()
		a, _ := json.Marshal(&reg)
		b, _ := json.Marshal(v.Worker)
		if string(a) == string(b) {
			c.markSynced(id)
			return
		}
		if !c.isSynced(id) {
			// A worker this gateway declares or discovers is its own: an
			// entry under its id, from another replica's API or from
			// whoever can write the bucket, would replace it here (and a
			// deletion after it would then remove it) until the next
			// reload.
			r.ctr.drop("catalog_local")
			return
		}
	}
	if _, err := cat.UpsertWorker(v.Worker); err != nil {
		r.ctr.drop("catalog_rejected")
		r.log.Warn("a worker from the catalog bucket was refused by this replica's catalog",
			zap.Uint64("worker_id", id), zap.String("from", v.Origin), zap.Error(err))
		return
	}
	c.markSynced(id)
	r.ctr.catalogApplied.Add(1)
}

func (c *catalogSync) isSynced(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.synced[id]
}

func (c *catalogSync) markSynced(id uint64) {
	c.mu.Lock()
	c.synced[id] = true
	c.mu.Unlock()
}

// remove deletes worker id if its record came from the API or the bucket.
func (c *catalogSync) remove(id uint64) {
	c.mu.Lock()
	was := c.synced[id]
	delete(c.synced, id)
	c.mu.Unlock()
	if !was {
		return
	}
	if _, err := c.r.router.Catalog().DeleteWorker(id); err == nil {
		c.r.ctr.catalogApplied.Add(1)
	}
}
