package selection

// requestSetup is the setup that selecting (Select, SelectAndReserve) and
// scoring (PotentialLoads, OverlapScores) share: the request's partition
// and scoring knobs, its normalised prompt, and the index's matches for
// it, in w. w is pooled: the caller gives it back with putWork.
type requestSetup struct {
	key PartitionKey
	p   *partition
	s   scoring
	w   *work
	np  normPrompt
}

// setupRequest checks a prompt-carrying request and does that shared setup.
// The checks run in a fixed order, so a request wrong in several ways
// always gets the same error: the override, the session id (empty for a
// request without one), the partition, then the prompt.
func (e *selector) setupRequest(part *Partition, override *RouterConfigOverride, pr *Prompt, session string) (requestSetup, error) {
	key := part.Key()
	s, err := e.cfg.get().scoring(override)
	if err != nil {
		return requestSetup{}, err
	}
	if err := checkSession(session); err != nil {
		return requestSetup{}, err
	}
	if err := checkPartition(key); err != nil {
		return requestSetup{}, err
	}
	p, err := e.catalog.schedulablePartition(key)
	if err != nil {
		return requestSetup{}, err
	}
	w := getWork()
	np, err := normalize(pr, p, &s, w, true)
	if err != nil {
		putWork(w)
		return requestSetup{}, err
	}
	e.findMatches(key, w)
	return requestSetup{key: key, p: p, s: s, w: w, np: np}, nil
}
