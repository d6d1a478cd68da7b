package lifecycle

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestRunAllWaitsForEveryService: RunAll returns only after every service
// returned, and reports a service's own error but not the context's.
func TestRunAllWaitsForEveryService(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	var done atomic.Int32
	slow := Func(func(ctx context.Context) error {
		<-ctx.Done()
		time.Sleep(50 * time.Millisecond) // cleanup after the stop
		done.Add(1)
		return ctx.Err()
	})
	broken := Func(func(context.Context) error { done.Add(1); return errors.New("broken") })
	errc := make(chan error, 1)
	go func() { errc <- RunAll(ctx, slow, slow, broken) }()
	cancel()
	err := <-errc
	assert.EqualError(t, err, "broken")
	assert.EqualValues(t, 3, done.Load(), "every service had returned")
}

func TestSleepEndsWithItsContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	assert.False(t, Sleep(ctx, time.Hour))
	assert.Less(t, time.Since(start), time.Second)
	assert.True(t, Sleep(context.Background(), time.Millisecond))
}
