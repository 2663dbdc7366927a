package caddymodule

import (
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// A ledger per catalog remembers the workers discovery created in it and
// which config's discoverer may write. It is kept apart from the configs
// because the catalog outlives them: a reload hands the running router to
// the next config, whose discoverer must know which workers are its own to
// update or delete (and which it must never touch: those declared in the
// Caddyfile or registered through the API). During a reload the new
// config starts before the old one stops; the newest running discoverer
// alone writes, and if the new config fails to start, the old one writes
// again.
var discoveryLedgers = struct {
	mu sync.Mutex
	// The key is weak so that a closed router's ledger goes with it.
	m map[weak.Pointer[selection.Catalog]]*discoveryLedger
}{m: map[weak.Pointer[selection.Catalog]]*discoveryLedger{}}

// discoveryLedger is one catalog's.
type discoveryLedger struct {
	mu      sync.Mutex
	owned   map[uint64]*ownedWorker // the workers discovery created, by id
	running []*discoverer           // started and not stopped, oldest first: the last one writes
	// counts are the workers per name, for the gauge: a copy replaced
	// after each change, so a scrape never waits for a refresh's writes.
	counts atomic.Pointer[map[string]int]
	// joining counts configs waiting for mu to join: a refresh's writes
	// stop for them (the new config carries on from there). Each write may
	// probe the endpoint (the catalog's check that it is not the gateway),
	// two seconds for one that accepts and never answers: a reload waited
	// 38 s behind a refresh writing 20 such workers.
	joining atomic.Int32
	// names are what the ledger remembers of each name between answers,
	// whichever config wrote them.
	names map[string]*nameMemory
}

// nameMemory is a name's state across answers and reloads.
type nameMemory struct {
	// emptySince is the first of the answers in a row without records;
	// zero after one with.
	emptySince time.Time
	// events and replay keep SRV targets' sibling ports through one
	// answer that lacks them.
	events, replay siblingGrace
}

// memoryOf is name's memory, made on first use. Under mu.
func (l *discoveryLedger) memoryOf(name string) *nameMemory {
	if l.names == nil {
		l.names = map[string]*nameMemory{}
	}
	m := l.names[name]
	if m == nil {
		m = &nameMemory{}
		l.names[name] = m
	}
	return m
}

// ownedWorker is a worker discovery created.
type ownedWorker struct {
	name   string     // the canonical name it was found under
	spec   workerSpec // what was last written
	misses int        // answers in a row without its record
	// addedBy is the discoverer that added it (its gen): a config whose
	// load failed takes the workers it added with it.
	addedBy uint64
}

// ledgerFor returns catalog's ledger, made on first use.
func ledgerFor(catalog *selection.Catalog) *discoveryLedger {
	discoveryLedgers.mu.Lock()
	defer discoveryLedgers.mu.Unlock()
	maps.DeleteFunc(discoveryLedgers.m, func(k weak.Pointer[selection.Catalog], _ *discoveryLedger) bool {
		return k.Value() == nil
	})
	key := weak.Make(catalog)
	l := discoveryLedgers.m[key]
	if l == nil {
		l = &discoveryLedger{owned: map[uint64]*ownedWorker{}}
		discoveryLedgers.m[key] = l
	}
	return l
}

// writer is the discoverer that may write; nil when none runs. Under mu.
func (l *discoveryLedger) writer() *discoverer {
	if len(l.running) == 0 {
		return nil
	}
	return l.running[len(l.running)-1]
}

// leave takes d out of the running discoverers; the one before it, if
// any, writes again. When d was the writer (its config's load failed: a
// config that replaced it would be the writer), that one takes the
// catalog back as it was: the workers d added go (another port, another
// name), and its own names are resolved at once, where d's join had
// swept them. Left to their next refresh, a refused config's workers
// stayed until the next load, or a refresh of the running config, and
// took traffic; the running config's came back only at their refresh.
func (l *discoveryLedger) leave(d *discoverer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	wrote := l.writer() == d
	l.running = slices.DeleteFunc(l.running, func(r *discoverer) bool { return r == d })
	if back := l.writer(); wrote && back != nil {
		for _, id := range slices.Sorted(maps.Keys(l.owned)) {
			if o := l.owned[id]; o.addedBy == d.gen {
				back.removeLocked(id, o, "added by a config whose load failed")
			}
		}
		back.sweepLocked()
		back.resolveAgain()
	}
	l.recount()
}

// yield deletes the workers discovery made in catalog at endpoints
// (host:port) that another worker is to have: a declared worker's
// endpoint is its own.
func (l *discoveryLedger) yield(catalog *selection.Catalog, endpoints map[string]bool, logger *zap.Logger) {
	if len(endpoints) == 0 {
		return
	}
	// A refresh under way stops at its next write for this, as for a
	// joining config: a reload waited behind a refresh's every write.
	l.joining.Add(1)
	l.mu.Lock()
	l.joining.Add(-1)
	defer l.mu.Unlock()
	for _, id := range slices.Sorted(maps.Keys(l.owned)) {
		if o := l.owned[id]; endpoints[o.spec.endpoint()] {
			l.removeLocked(catalog, logger, id, o, "a worker the config declares has its endpoint")
		}
	}
	l.recount()
}

// resolveAgain asks the writing discoverer to resolve its names now: a
// config's declarations that made discovery's workers give way were
// refused after all, and the engines would wait a refresh for theirs.
func (l *discoveryLedger) resolveAgain() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.writer(); w != nil {
		w.resolveAgain()
	}
}

// known returns what name holds. Under mu.
func (l *discoveryLedger) known(name string) knownServers {
	k := knownServers{endpoints: map[netip.AddrPort]bool{}, targets: map[string]map[netip.Addr]bool{}}
	for _, o := range l.owned {
		if o.name == name {
			k.endpoints[o.spec.addrPort()] = true
			if t := o.spec.target; t != "" {
				if k.targets[t] == nil {
					k.targets[t] = map[netip.Addr]bool{}
				}
				k.targets[t][o.spec.ip] = true
			}
		}
	}
	return k
}

// recount publishes the workers per name for the gauge, 0 for a name
// the writer follows that has none, and nothing once no config runs
// (the router goes with the last one). Under mu.
func (l *discoveryLedger) recount() {
	counts := map[string]int{}
	w := l.writer()
	if w == nil {
		l.counts.Store(&counts)
		return
	}
	for _, watch := range w.watches {
		counts[watch.key] = 0
	}
	for _, o := range l.owned {
		counts[o.name]++
	}
	l.counts.Store(&counts)
}

// discoveredCounts sums the workers per name over the live ledgers.
func discoveredCounts() map[string]int {
	discoveryLedgers.mu.Lock()
	ledgers := slices.Collect(maps.Values(discoveryLedgers.m))
	discoveryLedgers.mu.Unlock()
	out := map[string]int{}
	for _, l := range ledgers {
		if c := l.counts.Load(); c != nil {
			for name, n := range *c {
				out[name] += n
			}
		}
	}
	return out
}
