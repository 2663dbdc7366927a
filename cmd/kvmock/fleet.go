package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// Fleet is the whole simulation: N workers, each with its HTTP server and
// one engine per DP rank, the shared ZMQ context and publishers, and the
// fleet admin server.
type Fleet struct {
	cfg     Config
	zctx    *zmq.Context
	pub     *publisher
	workers []*worker

	admin     *http.Server
	adminLn   net.Listener
	adminDone chan struct{}

	closeOnce sync.Once
}

// NewFleet binds every socket and listener, then starts serving. Nothing is
// left running when it fails.
func NewFleet(cfg Config) (*Fleet, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f := &Fleet{cfg: cfg}
	c := &f.cfg
	zctx, err := zmq.NewContext()
	if err != nil {
		return nil, err
	}
	// Two sockets per rank plus the control pair; libzmq's default limit of
	// 1,023 sockets per context is below what a 1,024-worker fleet needs.
	nranks := c.Workers * c.DPRanks
	if need := 2*nranks + 16; need > zmq.MaxSocketsDflt {
		if err := zctx.SetMaxSockets(need); err != nil {
			_ = zctx.Term()
			return nil, fmt.Errorf("raising the ZMQ socket limit to %d: %w", need, err)
		}
	}
	f.zctx = zctx

	ranks := make([]*rankPub, 0, nranks)
	for i := range c.Workers {
		for r := range c.DPRanks {
			ranks = append(ranks, &rankPub{idx: len(ranks), worker: i + 1, dpRank: r})
		}
	}
	if f.pub, err = startPublisher(zctx, ranks, c); err != nil {
		_ = zctx.Term()
		return nil, err
	}

	fail := func(err error) (*Fleet, error) {
		for _, w := range f.workers {
			_ = w.ln.Close()
		}
		f.pub.close()
		_ = f.zctx.Term()
		return nil, err
	}
	for i := range c.Workers {
		engines := make([]*engine, c.DPRanks)
		for r := range engines {
			engines[r] = newEngine(c, i+1, r, ranks[i*c.DPRanks+r])
		}
		w, err := newWorker(c, i+1, engines)
		if err != nil {
			return fail(fmt.Errorf("worker %d: %w", i+1, err))
		}
		f.workers = append(f.workers, w)
	}
	if c.Admin != "" {
		if f.adminLn, err = net.Listen("tcp", c.Admin); err != nil {
			return fail(fmt.Errorf("admin: %w", err))
		}
		f.admin = &http.Server{Handler: f.adminHandler(), ReadHeaderTimeout: 10 * time.Second}
		f.adminDone = make(chan struct{})
	}

	for _, w := range f.workers {
		for _, e := range w.engines {
			e.start(f.pub)
		}
		go w.serve()
	}
	if f.admin != nil {
		go func() {
			defer close(f.adminDone)
			_ = f.admin.Serve(f.adminLn)
		}()
	}
	return f, nil
}

// AdminAddr is the admin server's bound address, or "" without one.
func (f *Fleet) AdminAddr() string {
	if f.adminLn == nil {
		return ""
	}
	return f.adminLn.Addr().String()
}

// worker returns the worker with the given 1-based id.
func (f *Fleet) worker(id int) (*worker, error) {
	if id < 1 || id > len(f.workers) {
		return nil, errors.New("no such worker")
	}
	return f.workers[id-1], nil
}

// Close stops everything: the admin server, every worker's HTTP server and
// engines, then the publishers (which close their sockets), and finally the
// ZMQ context.
func (f *Fleet) Close() {
	f.closeOnce.Do(func() {
		if f.admin != nil {
			_ = f.admin.Close()
			<-f.adminDone
		}
		var wg sync.WaitGroup
		for _, w := range f.workers {
			wg.Go(w.stop)
		}
		wg.Wait()
		f.pub.close()
		_ = f.zctx.Term()
	})
}
