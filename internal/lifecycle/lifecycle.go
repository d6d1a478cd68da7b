// Package lifecycle is how Composer's background loops start and stop:
// every loop is a Service whose Run blocks until its context ends and
// every goroutine it started has returned, so a process that stops waits
// for all of its work; and every wait is cut short by the context.
package lifecycle

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Service is a background loop. Run returns once ctx has ended and all its
// goroutines have returned (or earlier, with an error, if it cannot go on).
type Service interface {
	Run(ctx context.Context) error
}

// Func adapts a function to Service.
type Func func(ctx context.Context) error

// Run calls f.
func (f Func) Run(ctx context.Context) error { return f(ctx) }

// RunAll runs the services until ctx ends and waits for every one of them.
// It returns the first error other than ctx's own.
func RunAll(ctx context.Context, services ...Service) error {
	var wg sync.WaitGroup
	errc := make(chan error, len(services))
	for _, s := range services {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Run(ctx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				errc <- err
			}
		}()
	}
	wg.Wait()
	close(errc)
	return <-errc
}

// Sleep waits for d or until ctx ends, and reports whether all of d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
