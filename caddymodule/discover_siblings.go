package caddymodule

// siblingGrace keeps an SRV target's sibling port (its event or replay
// port, from kv_events_srv or replay_srv) through one answer that lacks
// it, as a record that went away keeps its worker through one answer.
// One NXDOMAIN for the sibling name rewrote every worker without its
// event endpoint at once: all became incomplete, the listeners stopped,
// and requests got 503 until the next refresh. It is the ledger's
// (nameMemory), under its mu.
type siblingGrace struct {
	sibling string            // the sibling name the ports are of
	last    map[string]uint16 // target → its port in the latest answer that had one
	missed  map[string]bool   // targets whose port the latest answer lacked
}

// hold fills in, on specs, the port of each target that the answer lacks
// but the answer before had, once; port selects the sibling's port of a
// spec. The ports are sibling's: another sibling name (a reload that
// renames it), or none, starts afresh.
func (g *siblingGrace) hold(sibling string, specs []workerSpec, port func(*workerSpec) *uint16) {
	if sibling != g.sibling || sibling == "" {
		*g = siblingGrace{sibling: sibling}
		if sibling == "" {
			return
		}
	}
	last, missed := map[string]uint16{}, map[string]bool{}
	for i := range specs {
		t, p := specs[i].target, port(&specs[i])
		switch prev, had := g.last[t]; {
		case *p != 0:
			last[t] = *p
		case had && !g.missed[t]:
			*p, last[t], missed[t] = prev, prev, true
		}
	}
	g.last, g.missed = last, missed
}
