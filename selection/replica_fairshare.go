package selection

// makeRoom makes room in the table as a whole (maxOriginsInFull times the
// per-origin bounds) for a booking of origin with blocks prompt blocks,
// and reports whether there is room. While the table is full, an origin
// holding less than its fair share of it (the table over the origins
// holding bookings, this one counted) takes the place of a booking of an
// origin holding more than its share: the one that held most when the
// origins were last compared (m.hog), compared again once it is down to
// its share. Without it, the first origins to fill the table
// kept every other out for as long as they kept their bookings: eight
// names claiming a ten-minute lease locked a real replica's bookings out
// for ten minutes. Comparing the origins at each eviction took 5 µs a
// booking at a full table of 256. m.mu is held.
func (m *RemoteBookings) makeRoom(origin string, blocks, maxPerOrigin int) bool {
	capBookings, capBlocks := maxOriginsInFull*maxPerOrigin, maxOriginsInFull*m.maxBlocks
	origins := len(m.origins)
	if m.origins[origin] == nil {
		origins++
	}
	for {
		fullBookings := maxPerOrigin > 0 && m.bookings >= capBookings
		fullBlocks := m.maxBlocks > 0 && m.allBlocks+blocks > capBlocks
		switch {
		case !fullBookings && !fullBlocks:
			return true
		case fullBookings && len(m.origins[origin])+1 > capBookings/origins,
			fullBlocks && m.blocks[origin]+blocks > capBlocks/origins:
			return false // it has its share already: it waits for its own frees
		}
		share := capBookings / origins
		if fullBlocks {
			share = capBlocks / origins
		}
		if m.hog == "" || m.hogByBlocks != fullBlocks || m.held(m.hog, fullBlocks) <= share {
			m.hog, m.hogByBlocks = m.largestOrigin(fullBlocks), fullBlocks
		}
		if m.hog == "" || m.hog == origin || m.held(m.hog, fullBlocks) <= share {
			return false
		}
		m.evictOne(m.hog)
	}
}

// held is what origin holds: its blocks (byBlocks) or its bookings.
func (m *RemoteBookings) held(origin string, byBlocks bool) int {
	if byBlocks {
		return m.blocks[origin]
	}
	return len(m.origins[origin])
}

// largestOrigin is the origin holding most blocks (byBlocks) or most
// bookings, other than none; "" when the table is empty. Its scan is over
// at most maxPeers origins, and runs only while the table is full.
func (m *RemoteBookings) largestOrigin(byBlocks bool) string {
	largest, most := "", 0
	for o := range m.origins {
		if n := m.held(o, byBlocks); n > most {
			largest, most = o, n
		}
	}
	return largest
}

// evictOne releases one of origin's bookings, whichever the map yields
// first: which one matters little, since origin holds more than its share.
// The origin's later free of it finds it unknown, as a free of one dropped
// at its lease does. m.mu is held.
func (m *RemoteBookings) evictOne(origin string) {
	for id, b := range m.origins[origin] {
		m.dropLocked(origin, id, b)
		m.evicted.Add(1)
		return
	}
}
