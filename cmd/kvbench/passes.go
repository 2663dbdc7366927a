package main

import (
	"fmt"
	"time"
)

// summaryOf gives the common part of a pass's summary: run's summary
// itself, or the one a replaySummary embeds.
type summaryOf[S any] interface {
	*S
	base() *summary
}

func (s *summary) base() *summary { return s }

// runPasses sends a workload through each target in turn, as run and
// replay do: before each pass the fleet's caches are emptied (when reset
// names the fleet's /reset), during it the gateway's prediction counts
// are watched, and pass does the sending and summarizes it.
func runPasses[S any, P summaryOf[S]](targets [][2]string, reset string, watch *predictionWatch, pass func(name, url string) S) ([]S, error) {
	out := make([]S, 0, len(targets))
	for _, tg := range targets {
		if reset != "" {
			if err := postReset(reset); err != nil {
				return nil, err
			}
			time.Sleep(500 * time.Millisecond) // let the gateway apply the cleared caches
		}
		watch.start()
		s := pass(tg[0], tg[1])
		b := P(&s).base()
		b.Predictions = watch.stop()
		fmt.Printf("  %s: %d requests in %.1fs\n", tg[0], b.Requests+b.Errors, b.Seconds)
		out = append(out, s)
	}
	return out, nil
}
